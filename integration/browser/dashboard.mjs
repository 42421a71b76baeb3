// Drives the broker's web dashboard in headless Chromium: a refused token,
// then a good one; the submitted jobs with their pending reason; the card
// heatmap; a full-page screenshot. Run by integration/dashboard_test.go with
//   SPILLWAY_URL, SPILLWAY_TOKEN, PENDING_JOB, RUNNING_JOB, SCREENSHOT
// and optionally CHROMIUM (default /usr/bin/chromium). Prints one JSON line
// with what it saw; exits 1 with a message on any failure.
import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};

const url = env('SPILLWAY_URL');
const token = env('SPILLWAY_TOKEN');
const pending = env('PENDING_JOB');
const running = env('RUNNING_JOB');
const shot = env('SCREENSHOT');
const profile = mkdtempSync(join(tmpdir(), 'spillway-chromium-'));

const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  headless: true,
  viewport: { width: 1400, height: 900 },
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const errors = [];
try {
  const page = context.pages()[0] || await context.newPage();
  page.on('pageerror', (e) => errors.push(String(e)));
  // Chromium logs every non-2xx fetch as a console error; the page asks
  // for optional endpoints (404 when absent) and a refused token (401) on
  // purpose, so only script errors count.
  page.on('console', (m) => {
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) errors.push(m.text());
  });
  page.setDefaultTimeout(15000);

  await page.goto(url + '/ui/');
  await page.fill('#token', 'not-a-real-token-000000');
  await page.click('#login-form button[type=submit]');
  await page.waitForFunction(() => document.querySelector('#login-error').textContent.includes('refused'));
  const refused = await page.textContent('#login-error');

  await page.fill('#token', token);
  await page.click('#login-form button[type=submit]');
  await page.waitForSelector('#app:not([hidden])');
  const row = page.locator(`#pending tr[data-job="${pending}"]`);
  await row.waitFor();
  const reason = (await row.locator('td.reason').textContent()).trim();
  const name = (await row.locator('td').nth(1).textContent()).trim();
  await page.locator(`#running tr[data-job="${running}"]`).waitFor();
  await page.waitForSelector('#heat-compute .cell');
  const cells = await page.locator('#heat-compute .cell').count();
  const held = await page.locator('#heat-compute .cell.held').count();
  const who = await page.textContent('#who');
  const instances = (await page.textContent('#instances')).trim();
  const budgets = (await page.textContent('#budgets')).trim();
  await page.waitForFunction(() => document.querySelector('#chart-util svg') !== null);
  const stored = await page.evaluate(() => sessionStorage.getItem('spillway.token') !== null);
  await page.screenshot({ path: shot, fullPage: true });
  console.log(JSON.stringify({ refused, reason, name, cells, held, who, instances, budgets, stored, errors }));
} catch (e) {
  console.error('dashboard test failed:', e.message, errors.length ? 'page errors: ' + errors.join('; ') : '');
  process.exitCode = 1;
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
