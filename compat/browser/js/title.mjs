// Puppeteer (puppeteer-core, unmodified, pinned in package.json) connects to a sandbox's
// DevTools URL as its users do, `puppeteer.connect({ browserWSEndpoint })`, opens a page at
// a URL and prints the page's title. Used by test_cdp.py.
//
//   node title.mjs <cdp_url> <page url>

import puppeteer from 'puppeteer-core';

const [cdpUrl, pageUrl] = process.argv.slice(2);
if (!cdpUrl || !pageUrl) {
  console.error('usage: node title.mjs <cdp_url> <page url>');
  process.exit(2);
}

const browser = await puppeteer.connect({ browserWSEndpoint: cdpUrl, protocolTimeout: 600_000 });
try {
  const page = await browser.newPage();
  await page.goto(pageUrl, { timeout: 600_000 });
  console.log(await page.title());
  await page.close();
} finally {
  await browser.disconnect();
}
