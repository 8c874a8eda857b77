// A tiny inline-SVG line chart for CPU samples.

import { s } from '../dom.js';

/**
 * values: numbers from 0 to max, oldest first. Returns an <svg> with a <title> for hovering.
 */
export function sparkline(values, { max = 100, width = 80, height = 18, title = '' } = {}) {
  const svg = s('svg', { class: 'spark', viewBox: `0 0 ${width} ${height}`, width, height,
    role: 'img', 'aria-label': title || 'chart' }, s('title', {}, title));
  if (values.length === 0) return svg;
  const step = values.length > 1 ? width / (values.length - 1) : 0;
  const y = (v) => (height - 1 - (Math.min(Math.max(v, 0), max) / max) * (height - 2)).toFixed(1);
  const pts = values.map((v, i) => `${(i * step).toFixed(1)},${y(v)}`);
  if (values.length === 1) pts.push(`${width},${y(values[0])}`);
  svg.appendChild(s('polyline', { points: pts.join(' '), fill: 'none', class: 'spark-line',
    'stroke-width': 1.5, 'stroke-linejoin': 'round' }));
  return svg;
}
