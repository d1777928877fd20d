// Opens an HTML page in headless Chromium through the DevTools protocol (over a pipe: no
// WebSocket, no npm package), and prints one JSON object: the plots of the page (data-plot,
// the points each holds, whether it says its data is absent), every console message, page
// error and failed or outside request, and the page's size; it writes a full-page PNG.
// usage: node report_browser.js CHROMIUM PAGE.html SHOT.png USER_DATA_DIR
'use strict';
const { spawn } = require('child_process');
const path = require('path');

const [chromium, page, shot, userDir] = process.argv.slice(2);
const url = 'file://' + path.resolve(page);
const proc = spawn(chromium, [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
  '--user-data-dir=' + userDir, '--remote-debugging-pipe', '--window-size=1360,900',
  'about:blank',
], { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'] });
proc.stderr.on('data', () => {}); // chromium's own log lines (dbus, ...) are not the page's
const out = proc.stdio[3], inp = proc.stdio[4];

let next = 1;
const waiting = new Map(), listeners = [];
let buf = Buffer.alloc(0);
inp.on('data', (chunk) => {
  buf = Buffer.concat([buf, chunk]);
  let end;
  while ((end = buf.indexOf(0)) >= 0) {
    const msg = JSON.parse(buf.subarray(0, end).toString('utf8'));
    buf = buf.subarray(end + 1);
    if (msg.id && waiting.has(msg.id)) {
      const { resolve, reject } = waiting.get(msg.id);
      waiting.delete(msg.id);
      if (msg.error) reject(new Error(JSON.stringify(msg.error)));
      else resolve(msg.result);
    } else if (msg.method) {
      for (const l of listeners) l(msg);
    }
  }
});
function send(method, params = {}, sessionId) {
  const id = next++;
  const msg = { id, method, params };
  if (sessionId) msg.sessionId = sessionId;
  out.write(JSON.stringify(msg) + '\0');
  return new Promise((resolve, reject) => waiting.set(id, { resolve, reject }));
}

const problems = [];
async function main() {
  const timer = setTimeout(() => {
    problems.push('timed out after 60 s');
    finish({});
  }, 60000);
  const { targetId } = await send('Target.createTarget', { url: 'about:blank' });
  const { sessionId } = await send('Target.attachToTarget', { targetId, flatten: true });
  let loaded;
  const load = new Promise((r) => (loaded = r));
  listeners.push((m) => {
    if (m.sessionId !== sessionId) return;
    const p = m.params;
    if (m.method === 'Page.loadEventFired') loaded();
    if (m.method === 'Runtime.consoleAPICalled')
      problems.push('console.' + p.type + ': ' + p.args.map((a) => a.value).join(' '));
    if (m.method === 'Runtime.exceptionThrown')
      problems.push('exception: ' + JSON.stringify(p.exceptionDetails.text));
    if (m.method === 'Log.entryAdded' && (p.entry.level === 'error' || p.entry.level === 'warning'))
      problems.push('log ' + p.entry.level + ': ' + p.entry.text);
    if (m.method === 'Network.requestWillBeSent' && p.request.url !== url &&
        !p.request.url.startsWith('data:'))
      problems.push('request to ' + p.request.url);
    if (m.method === 'Network.loadingFailed') problems.push('loading failed: ' + p.errorText);
  });
  for (const d of ['Page', 'Runtime', 'Log', 'Network']) await send(d + '.enable', {}, sessionId);
  await send('Page.navigate', { url }, sessionId);
  await load;
  const { result } = await send('Runtime.evaluate', {
    returnByValue: true,
    expression: `(() => {
      const plots = [...document.querySelectorAll('[data-plot]')].map((e) => ({
        plot: e.dataset.plot,
        points: e.querySelectorAll('.pt').length,
        declared: e.dataset.points === undefined ? null : Number(e.dataset.points),
        absent: e.dataset.absent === '1',
        width: e.getBoundingClientRect().width,
        tooltips: e.querySelectorAll('.pt > title').length,
        text: e.dataset.absent === '1' ? e.textContent : '',
      }));
      return { title: document.title, plots, height: document.documentElement.scrollHeight,
               width: document.documentElement.scrollWidth,
               external: [...document.querySelectorAll('script,link,img,iframe,object,embed')]
                 .length };
    })()`,
  }, sessionId);
  const v = result.value;
  const shotData = await send('Page.captureScreenshot', {
    format: 'png', captureBeyondViewport: true,
    clip: { x: 0, y: 0, width: v.width, height: v.height, scale: 1 },
  }, sessionId);
  require('fs').writeFileSync(shot, Buffer.from(shotData.data, 'base64'));
  clearTimeout(timer);
  finish(v);
}
function finish(v) {
  v.problems = problems;
  process.stdout.write(JSON.stringify(v) + '\n');
  proc.kill('SIGKILL');
  process.exit(0);
}
main().catch((e) => {
  problems.push('devtools: ' + e.message);
  finish({});
});
