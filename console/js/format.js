// Formatting of sizes, times and modes for people.

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

export function bytes(n) {
  if (n === null || n === undefined || Number.isNaN(Number(n))) return '';
  let v = Number(n);
  let u = 0;
  while (v >= 1024 && u < UNITS.length - 1) { v /= 1024; u++; }
  return `${u === 0 ? v : v.toFixed(v < 10 ? 1 : 0)} ${UNITS[u]}`;
}

export function mib(n) {
  if (n === null || n === undefined) return '';
  return n >= 1024 && n % 1024 === 0 ? `${n / 1024} GiB` : `${n} MiB`;
}

/** A span of milliseconds, short: 45s, 12m, 3h, 5d. */
export function span(ms) {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

/** How long ago a Unix-ms time was. */
export function ago(unixMs) {
  if (!unixMs) return '';
  return `${span(Date.now() - unixMs)} ago`;
}

const pad = (n) => String(n).padStart(2, '0');

/** A local date and time, 2025-11-30 14:05:09. */
export function time(unixMs) {
  if (unixMs === null || unixMs === undefined) return '';
  const d = new Date(unixMs);
  if (Number.isNaN(d.getTime())) return '';
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

/** ls-style mode: drwxr-xr-x. */
export function mode(fileType, bits) {
  const t = { dir: 'd', symlink: 'l', file: '-' }[fileType] ?? '?';
  const rwx = 'rwxrwxrwx';
  let out = t;
  for (let i = 0; i < 9; i++) out += (bits & (1 << (8 - i))) ? rwx[i] : '-';
  return out;
}

export function plural(n, one, many = `${one}s`) {
  return `${n} ${n === 1 ? one : many}`;
}
