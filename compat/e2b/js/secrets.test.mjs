// E2B's secrets through the JavaScript SDK, unmodified, against a live space server (the
// driver is crates/space/tests/e2b.rs): kept write-only, and put into a request's headers by
// the gateway where the sandbox's network rules say, so the guest never holds the value.
import assert from 'node:assert/strict'
import { randomUUID } from 'node:crypto'
import { createServer } from 'node:http'
import { test } from 'node:test'

import { Sandbox, Secret, SecretError, SecretNotFoundError } from 'e2b'

const TEMPLATE = process.env.SPACE_TEMPLATE ?? 'base'

test('a secret is kept write-only and the gateway sends it where the rules say', async () => {
  const seen = []
  const server = createServer((req, res) => {
    seen.push([req.url, req.headers.authorization ?? null])
    const body = `auth=${req.headers.authorization ?? ''}`
    res.writeHead(200, { 'Content-Length': Buffer.byteLength(body) })
    res.end(body)
  })
  await new Promise((ok) => server.listen(0, '127.0.0.1', ok))
  const port = server.address().port
  const name = `JS-Token-${randomUUID().slice(0, 8)}`
  const value = `js-${randomUUID()}`
  const info = await Secret.create(name, value, { metadata: { by: 'js' } })
  try {
    assert.match(info.secretId, /^sec_[0-9a-f]{32}$/)
    assert.equal(info.name, name.toLowerCase())
    assert.equal(info.version, 1)
    assert.deepEqual(info.metadata, { by: 'js' })
    assert.equal((await Secret.getInfo(name)).secretId, info.secretId)
    await assert.rejects(Secret.create(name, 'again'), SecretError)

    const rules = {
      '127.0.0.1': [{ transform: { headers: { Authorization: `Bearer ${Secret.fill(name)}` } } }],
    }
    const sbx = await Sandbox.create(TEMPLATE, {
      timeoutMs: 300_000,
      network: { allowOut: ['127.0.0.1'], denyOut: ['0.0.0.0/0'], rules },
    })
    try {
      const run = (path) =>
        sbx.commands.run(
          `curl -sS -m 20 --noproxy '' -H 'Authorization: guest' http://127.0.0.1:${port}${path}`,
          { timeoutMs: 60_000 },
        )
      const out = await run('/js-one')
      assert.ok(!out.stdout.includes(value), out.stdout)
      assert.deepEqual(seen.at(-1), ['/js-one', `Bearer ${value}`])
      const updated = await Secret.update(info.secretId, `${value}-2`)
      assert.equal(updated.version, 2)
      await run('/js-two')
      assert.deepEqual(seen.at(-1), ['/js-two', `Bearer ${value}-2`])
    } finally {
      await sbx.kill()
    }
  } finally {
    assert.equal(await Secret.destroy(info.secretId), true)
    server.close()
  }
  assert.equal(await Secret.destroy(info.secretId), false)
  assert.equal(await Secret.exists(name), false)
  await assert.rejects(Secret.getInfo(info.secretId), SecretNotFoundError)
})
