// The e2b-desktop JavaScript SDK, unmodified, against a live space server. The driver
// (crates/space/tests/e2b_desktop.rs) sets E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY,
// SPACE_OTHER_KEY and SPACE_CA (the deployment CA's certificate, which signs the https
// ingress hosts the SDK's stream URLs name). What each call does is read back from the X
// server (an xev window's event log, the cursor), not taken on trust.
import assert from 'node:assert/strict'
import { readFileSync } from 'node:fs'
import https from 'node:https'
import { after, before, test } from 'node:test'

import { Sandbox } from '@e2b/desktop'
import { CommandExitError, SandboxError } from 'e2b'

let desktop

before(async () => {
  desktop = await Sandbox.create({ timeoutMs: 1_800_000, envs: { SPACE_MARK: 'js-create' }, metadata: { suite: 'e2b-desktop-js' } })
})

after(async () => {
  if (desktop) await desktop.kill()
})

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// The focused window's id, or null while X reports the focus as PointerRoot (between a
// click and the window manager's focus change; `xdotool getwindowfocus` exits 1 then).
async function focusedWindow() {
  try {
    return await desktop.getCurrentWindowId()
  } catch (e) {
    if (`${e?.stderr ?? ''} ${e?.message ?? ''}`.includes('focused window of 1')) return null
    throw e
  }
}

async function until(what, check, timeoutMs = 60_000, intervalMs = 500) {
  const deadline = Date.now() + timeoutMs
  let last
  while (Date.now() < deadline) {
    last = await check()
    if (last) return last
    await sleep(intervalMs)
  }
  throw new Error(`${what}: not within ${timeoutMs} ms (last: ${JSON.stringify(last)})`)
}

// An xev window at a known place, and what X delivered to it.
async function eventLog(name, at = 100) {
  const path = `/tmp/${name}.xev`
  const title = `space-${name}`
  const h = await desktop.commands.run(
    `xev -name ${title} -geometry 400x300+${at}+${at} -event button -event keyboard -event mouse > ${path} 2>&1`,
    { background: true, timeoutMs: 0 })
  await h.disconnect()
  const window = await until('the xev window shows', async () => {
    const r = await desktop.commands.run(`xdotool search --onlyvisible --name '^${title}$' || true`)
    return r.stdout.split(/\s+/).filter(Boolean)[0]
  })
  // The SDK's create returns once Xfce's processes run; the window manager takes charge of
  // windows some seconds later and frames the ones already open, and a click sent then can be
  // lost: wait until it has made this window the active one, and measure it then.
  await until('the window manager takes the xev window', async () => {
    const r = await desktop.commands.run(
      `timeout 10 xdotool windowactivate --sync ${window} >/dev/null 2>&1; xdotool getactivewindow 2>/dev/null || true`)
    return r.stdout.trim() === window
  }, 180000, 1000)
  const geo = (await desktop.commands.run(`xdotool getwindowgeometry ${window}`)).stdout
  const [, px, py] = geo.match(/Position: (\d+),(\d+)/)
  const [, w, hh] = geo.match(/Geometry: (\d+)x(\d+)/)
  const blocks = async (kind) => (await desktop.files.read(path)).split('\n\n').filter((b) => b.startsWith(`${kind} event`))
  return {
    window,
    center: [Number(px) + Math.floor(w / 2), Number(py) + Math.floor(hh / 2)],
    buttons: async (kind = 'ButtonPress') => (await blocks(kind)).map((b) => Number(b.match(/button (\d+)/)?.[1])),
    keys: async () => (await blocks('KeyPress')).map((b) => b.match(/\(keysym 0x[0-9a-f]+, ([^)]+)\)/)?.[1]),
    close: () => desktop.commands.run(`xdotool windowkill ${window} || true`),
  }
}

// GET `url` (an ingress host under localhost) through the listener with the deployment CA.
function status(url) {
  const u = new URL(url)
  return new Promise((resolve, reject) => {
    const req = https.request({
      host: '127.0.0.1', port: u.port, path: u.pathname + u.search, servername: u.hostname,
      headers: { host: u.host }, ca: readFileSync(process.env.SPACE_CA),
    }, (res) => { res.resume(); res.on('end', () => resolve(res.statusCode)) })
    req.on('error', reject)
    req.end()
  })
}

function pngSize(bytes) {
  const b = Buffer.from(bytes)
  assert.equal(b.subarray(1, 4).toString(), 'PNG')
  return [b.readUInt32BE(16), b.readUInt32BE(20)]
}

test('the desktop runs with the create-time environment', async () => {
  for (const p of ['Xvfb', 'xfce4-session', 'xfwm4', 'xfdesktop']) await desktop.commands.run(`pgrep -x ${p}`)
  assert.equal((await desktop.commands.run('echo "$DISPLAY $SPACE_MARK"')).stdout, ':0 js-create\n')
  assert.deepEqual(await desktop.getScreenSize(), { width: 1024, height: 768 })
})

test('screenshots as bytes, blob and stream', async () => {
  assert.deepEqual(pngSize(await desktop.screenshot()), [1024, 768])
  assert.deepEqual(pngSize(await (await desktop.screenshot('blob')).arrayBuffer()), [1024, 768])
  const chunks = []
  for await (const c of await desktop.screenshot('stream')) chunks.push(Buffer.from(c))
  assert.deepEqual(pngSize(Buffer.concat(chunks)), [1024, 768])
})

test('mouse calls reach the window under the cursor', async () => {
  await desktop.moveMouse(321, 234)
  assert.deepEqual(await desktop.getCursorPosition(), { x: 321, y: 234 })
  const log = await eventLog('js-buttons')
  const [x, y] = log.center
  try {
    // Each at its own point: xdotool's `mousemove --sync` to where the pointer already is
    // waits for a move that never comes (seconds).
    await desktop.leftClick(x, y)
    await desktop.rightClick(x + 10, y)
    await desktop.middleClick(x + 20, y)
    await desktop.doubleClick(x + 30, y)
    await desktop.scroll('up', 2)
    await desktop.scroll('down')
    await desktop.mousePress('middle')
    await desktop.mouseRelease('middle')
    await desktop.drag([x - 50, y - 50], [x + 50, y + 50])
    assert.deepEqual(await desktop.getCursorPosition(), { x: x + 50, y: y + 50 })
    const want = [1, 3, 2, 1, 1, 4, 4, 5, 2, 1]
    await until('every press logged', async () => JSON.stringify(await log.buttons()) === JSON.stringify(want), 30_000)
    assert.deepEqual(await log.buttons('ButtonRelease'), want)
  } finally {
    await log.close()
  }
})

test('write and press type into the focused window', async () => {
  const log = await eventLog('js-keys', 160)
  try {
    await desktop.leftClick(...log.center)
    await until('the window has the focus', async () => (await focusedWindow()) === log.window, 30_000)
    await desktop.write('typed 42', { chunkSize: 3, delayInMs: 5 })
    await desktop.press('enter')
    await desktop.press(['ctrl', 'c'])
    const want = ['t', 'y', 'p', 'e', 'd', 'space', '4', '2', 'Return', 'Control_L', 'c']
    await until('every key logged', async () => JSON.stringify(await log.keys()) === JSON.stringify(want), 30_000)
    assert.equal(await desktop.getWindowTitle(log.window), 'space-js-keys')
  } finally {
    await log.close()
  }
})

test('wait sleeps in the sandbox', async () => {
  const t = Date.now()
  await desktop.wait(1000)
  assert.ok(Date.now() - t >= 1000)
})

test('stream: start, url, auth, stop', async () => {
  await desktop.stream.start({ requireAuth: true })
  const key = await desktop.stream.getAuthKey()
  assert.equal(key.length, 16)
  const url = desktop.stream.getUrl({ authKey: key })
  assert.ok(url.startsWith(`https://6080-${desktop.sandboxId}.`), url)
  assert.ok(url.includes(`password=${key}`), url)
  await assert.rejects(desktop.stream.start(), /already running/)
  assert.equal(await status(url), 200)
  await desktop.stream.stop()
  await assert.rejects(desktop.commands.run('pgrep -x x11vnc'), CommandExitError)
  await until('the stream port closes', async () => (await status(url)) >= 500)
})

test('another tenant cannot connect', async () => {
  await assert.rejects(Sandbox.connect(desktop.sandboxId, { apiKey: process.env.SPACE_OTHER_KEY }), SandboxError)
})
