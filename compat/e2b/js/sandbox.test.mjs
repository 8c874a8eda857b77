// The E2B JavaScript SDK, unmodified, against a live space server. The driver
// (crates/space/tests/e2b.rs) sets E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, SPACE_OTHER_KEY
// and SPACE_TEMPLATE.
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { after, before, test } from 'node:test'

import { CommandExitError, NotFoundError, Sandbox } from 'e2b'

const TEMPLATE = process.env.SPACE_TEMPLATE ?? 'base'
let sbx

before(async () => {
  sbx = await Sandbox.create(TEMPLATE, { timeoutMs: 600_000, metadata: { suite: 'e2b-js' }, envs: { GREETING: 'hallo' } })
})

after(async () => {
  if (sbx) await sbx.kill()
})

test('commands: output, callbacks, exit codes, background and stdin', async () => {
  const out = await sbx.commands.run('echo $GREETING; echo err >&2')
  assert.equal(out.stdout, 'hallo\n')
  assert.equal(out.stderr, 'err\n')

  const lines = []
  await sbx.commands.run('for i in 1 2 3; do echo n$i; sleep 0.1; done', { onStdout: (l) => lines.push(l) })
  assert.equal(lines.join(''), 'n1\nn2\nn3\n')

  await assert.rejects(sbx.commands.run('exit 4'), (e) => e instanceof CommandExitError && e.exitCode === 4)

  const who = await sbx.commands.run('id -un; pwd')
  assert.equal(who.stdout, 'user\n/home/user\n')

  const long = await sbx.commands.run('sleep 600', { background: true })
  assert.ok((await sbx.commands.list()).some((p) => p.pid === long.pid))
  assert.equal(await sbx.commands.kill(long.pid), true)
  await assert.rejects(long.wait(), CommandExitError)

  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'js stdin\n')
  await sbx.commands.closeStdin(cat.pid)
  assert.equal((await cat.wait()).stdout, 'js stdin\n')
})

test('files: round trip by hash, list, rename, remove, not found', async () => {
  await sbx.files.write('js/hello.txt', 'hello from js\n')
  assert.equal(await sbx.files.read('/home/user/js/hello.txt'), 'hello from js\n')
  const blob = randomBytes(5 * 1024 * 1024)
  await sbx.files.write('/tmp/js.bin', blob)
  const back = await sbx.files.read('/tmp/js.bin', { format: 'bytes' })
  const sha = (b) => createHash('sha256').update(b).digest('hex')
  assert.equal(sha(Buffer.from(back)), sha(blob))
  assert.equal(await sbx.files.makeDir('/tmp/jsd'), true)
  assert.equal(await sbx.files.makeDir('/tmp/jsd'), false)
  await sbx.files.write('/tmp/jsd/a.txt', 'a')
  assert.deepEqual((await sbx.files.list('/tmp/jsd')).map((e) => e.name), ['a.txt'])
  await sbx.files.rename('/tmp/jsd/a.txt', '/tmp/jsd/b.txt')
  assert.equal(await sbx.files.exists('/tmp/jsd/a.txt'), false)
  assert.equal((await sbx.files.getInfo('/tmp/jsd/b.txt')).size, 1)
  await sbx.files.remove('/tmp/jsd')
  assert.equal(await sbx.files.exists('/tmp/jsd'), false)
  await assert.rejects(sbx.files.read('/tmp/none'), NotFoundError)
})

test('files: gzip octet-stream upload with metadata, seen by getInfo and list', async () => {
  const blob = Buffer.concat([randomBytes(512 * 1024), Buffer.alloc(512 * 1024, 7)])
  const info = await sbx.files.write('/tmp/js.gz', blob, { gzip: true, metadata: { Stage: 'build' } })
  assert.deepEqual(info.metadata, { stage: 'build' })
  const sha = (b) => createHash('sha256').update(b).digest('hex')
  const back = await sbx.files.read('/tmp/js.gz', { format: 'bytes' })
  assert.equal(sha(Buffer.from(back)), sha(blob))
  assert.deepEqual((await sbx.files.getInfo('/tmp/js.gz')).metadata, { stage: 'build' })
  const listed = (await sbx.files.list('/tmp')).find((e) => e.name === 'js.gz')
  assert.deepEqual(listed.metadata, { stage: 'build' })
})

test('watch, pty, connect by id, list by metadata, set timeout', async () => {
  await sbx.files.makeDir('/tmp/jsw')
  const seen = []
  const w = await sbx.files.watchDir('/tmp/jsw', (e) => seen.push(e))
  await sbx.files.write('/tmp/jsw/x.txt', 'x')
  for (let i = 0; i < 100 && !seen.some((e) => e.name === 'x.txt'); i++) await new Promise((r) => setTimeout(r, 100))
  await w.stop()
  assert.ok(seen.some((e) => e.name === 'x.txt'), JSON.stringify(seen))

  let data = ''
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { data += new TextDecoder().decode(d) } })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size; echo js-$((40+2))\n'))
  for (let i = 0; i < 200 && !data.includes('js-42'); i++) await new Promise((r) => setTimeout(r, 100))
  assert.ok(data.includes('24 80') && data.includes('js-42'), data)
  await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('stty size\n'))
  for (let i = 0; i < 200 && !data.includes('30 100'); i++) await new Promise((r) => setTimeout(r, 100))
  assert.ok(data.includes('30 100'), data)
  assert.equal(await sbx.pty.kill(term.pid), true)

  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await again.commands.run('cat ~/js/hello.txt')).stdout, 'hello from js\n')
  const found = await Sandbox.list({ query: { metadata: { suite: 'e2b-js' } } }).nextItems()
  assert.deepEqual(found.map((s) => s.sandboxId), [sbx.sandboxId])
  const others = await Sandbox.list({ apiKey: process.env.SPACE_OTHER_KEY }).nextItems()
  assert.ok(!others.some((s) => s.sandboxId === sbx.sandboxId))
  const before = (await sbx.getInfo()).endAt
  await sbx.setTimeout(1_200_000)
  assert.ok((await sbx.getInfo()).endAt > before)
})

test('metrics: samples of the running sandbox, bounded by range', async () => {
  // The sampler takes one every 5 s once it has a base: wait for two.
  let metrics = []
  for (let i = 0; i < 30 && metrics.length < 2; i++) {
    metrics = await sbx.getMetrics()
    if (metrics.length < 2) await new Promise((r) => setTimeout(r, 1000))
  }
  assert.ok(metrics.length >= 2, JSON.stringify(metrics))
  for (const m of metrics) {
    assert.ok(m.cpuCount >= 1 && m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, JSON.stringify(m))
    assert.ok(m.memUsed > 0 && m.memUsed <= m.memTotal, JSON.stringify(m))
    assert.ok(m.diskUsed > 0 && m.diskUsed <= m.diskTotal, JSON.stringify(m))
    assert.ok(m.timestamp instanceof Date, JSON.stringify(m))
  }
  const stamps = metrics.map((m) => m.timestamp.getTime())
  assert.deepEqual(stamps, [...stamps].sort((a, b) => a - b))
  assert.deepEqual(await sbx.getMetrics({ end: new Date(Date.now() - 3_600_000) }), [])
  const again = await Sandbox.getMetrics(sbx.sandboxId, { start: new Date(stamps.at(-1) - 1000) })
  assert.ok(again.length >= 1)
})

test('kill, then the sandbox is gone', async () => {
  const s = await Sandbox.create(TEMPLATE)
  assert.equal(await s.kill(), true)
  assert.equal(await Sandbox.kill(s.sandboxId), false)
  await assert.rejects(Sandbox.connect(s.sandboxId))
})
