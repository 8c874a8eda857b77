// Snapshots, forks and template builds through the E2B JavaScript SDK, unmodified, against a
// live space server (the driver is crates/space/tests/e2b.rs).
import assert from 'node:assert/strict'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { test } from 'node:test'

import { Sandbox, Template, waitForPort } from 'e2b'

const TEMPLATE = process.env.SPACE_TEMPLATE ?? 'base'

test('snapshots and forks keep files and processes', async () => {
  const sbx = await Sandbox.create(TEMPLATE, { timeoutMs: 300_000 })
  try {
    await sbx.files.write('/home/user/js.txt', 'before')
    await sbx.commands.run('sleep 7781', { background: true })
    const snap = await sbx.createSnapshot()
    assert.match(snap.snapshotId, /^snap-[0-9a-f]{16}$/)
    const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
    assert.ok(listed.some((s) => s.snapshotId === snap.snapshotId))

    const [fork] = await sbx.fork({ count: 1, timeoutMs: 120_000 })
    assert.ok(fork instanceof Sandbox, String(fork))
    try {
      assert.equal(await fork.files.read('/home/user/js.txt'), 'before')
    } finally {
      await fork.kill()
    }

    await sbx.files.write('/home/user/js.txt', 'after')
    const copy = await Sandbox.create(snap.snapshotId)
    try {
      assert.equal(await copy.files.read('/home/user/js.txt'), 'before')
      const ps = await copy.commands.run('ps -eo args', { user: 'root' })
      assert.ok(ps.stdout.includes('sleep 7781'), ps.stdout)
    } finally {
      await copy.kill()
    }
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
  } finally {
    await sbx.kill()
  }
})

test('Template.build makes a template sandboxes start from', async () => {
  const ctx = mkdtempSync(join(tmpdir(), 'space-e2b-js-'))
  writeFileSync(join(ctx, 'page.html'), 'built by the JS SDK')
  const name = `js-built-${process.pid}`
  const template = Template({ fileContextPath: ctx })
    .fromTemplate('base')
    .copy('page.html', '/srv/site/')
    .runCmd('echo js > /home/user/made-by')
    .setEnvs({ FROM_JS: 'yes' })
    .setStartCmd('cd /srv/site && python3 -m http.server 8001', waitForPort(8001))
  const logs = []
  const info = await Template.build(template, name, { onBuildLogs: (e) => logs.push(e.message) })
  assert.equal(info.templateId, name)
  const sbx = await Sandbox.create(name)
  try {
    assert.equal(await sbx.files.read('/home/user/made-by'), 'js\n')
    assert.equal((await sbx.commands.run('echo $FROM_JS')).stdout, 'yes\n')
    const page = await sbx.commands.run('curl -s localhost:8001/page.html')
    assert.equal(page.stdout, 'built by the JS SDK')
  } finally {
    await sbx.kill()
  }
  assert.equal(await Sandbox.deleteSnapshot(name), true)
})
