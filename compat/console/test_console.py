"""What a person does in the web console, in a real browser against real guests: log in,
create a sandbox, type in its terminal, upload a file, roll back from the snapshot timeline,
and see nothing of another tenant's. Names, output and metadata a guest controls are written
to be scripts; the page must show them as text (any dialog fails the test)."""

import os
import time
import uuid

from conftest import URL, api, cli, login, no_injected_markup, wait_until

TENANT = os.environ["SPACE_TENANT_KEY"]
OTHER = os.environ["SPACE_OTHER_KEY"]
ADMIN = os.environ["SPACE_API_KEY"]
TEMPLATE = os.environ.get("SPACE_TEMPLATE", "base")
HOSTILE_NAME = "<img src=x onerror=alert(1)>"

TERMINAL_TEXT = """() => {
    const t = window.spaceConsole && window.spaceConsole.terminal;
    if (!t) return '';
    const b = t.buffer.active;
    let s = '';
    for (let i = 0; i < b.length; i++) {
        const line = b.getLine(i);
        if (line) s += line.translateToString(true) + '\\n';
    }
    return s;
}"""


def wait_terminal(page, needle, timeout=120):
    deadline = time.time() + timeout
    while needle not in page.evaluate(TERMINAL_TEXT):
        assert time.time() < deadline, f"the terminal never showed {needle!r}"
        time.sleep(0.3)


def row_with(page, test, attr, value):
    """Waits for an element `[data-test=test]` whose `attr` is exactly `value` (compared in
    the page, so any characters work)."""
    wait_until(
        page,
        "([t, a, v]) => [...document.querySelectorAll(`[data-test=${t}]`)]"
        ".some(e => e.getAttribute(a) === v)",
        [test, attr, value],
        timeout=120,
        what=f"{test} with {attr}={value!r}",
    )


def sandbox_id_from(page):
    wait_until(page, "() => location.hash.startsWith('#/sandboxes/sbx-')", timeout=300)
    return page.evaluate("location.hash").split("/")[2]


def test_a_person_drives_a_sandbox_from_the_console(console):
    page = console.page
    login(console, TENANT)
    # A sandbox whose metadata is markup: the list shows it as text.
    marked = api(
        "POST",
        "/v1/sandboxes",
        TENANT,
        {"template": TEMPLATE, "metadata": {"note": "<img src=x onerror=alert(2)>"}},
    )["id"]

    # ---- create from the list ----
    page.click("[data-test=new-sandbox]")
    page.select_option("[data-test=create-template]", TEMPLATE)
    page.click("[data-test=create-submit]")
    sid = sandbox_id_from(page)
    page.click("[data-test=nav-sandboxes]")
    row_with(page, "sandbox-row", "data-id", sid)
    row_with(page, "sandbox-row", "data-id", marked)
    wait_until(
        page,
        "id => document.querySelector(`[data-test=sandbox-row][data-id=${id}]`)"
        ".getAttribute('data-state') === 'running'",
        sid,
        timeout=120,
    )
    no_injected_markup(page)
    console.shot("01-sandboxes")

    # ---- the terminal ----
    page.goto(f"{URL}/#/sandboxes/{sid}/terminal")
    page.wait_for_selector("[data-test=terminal]")
    page.click("[data-test=terminal]")
    # Wait for the shell's prompt before typing.
    deadline = time.time() + 120
    while "$" not in page.evaluate(TERMINAL_TEXT) and "#" not in page.evaluate(TERMINAL_TEXT):
        assert time.time() < deadline, "no prompt in the terminal"
        time.sleep(0.3)
    page.keyboard.type("echo console-$((6*7))\n")
    wait_terminal(page, "console-42")
    # Output that is markup stays text in the terminal.
    page.keyboard.type("printf '%s\\n' '<img src=x onerror=alert(3)>'\n")
    wait_terminal(page, "<img src=x onerror=alert(3)>")
    no_injected_markup(page)
    console.shot("02-terminal")

    # ---- files: upload a file whose name is markup, find it with `space exec` ----
    page.click("[data-test=tab-files]")
    page.wait_for_selector("[data-test=file-input]", state="attached")
    body = f"uploaded from the console {uuid.uuid4().hex}\n".encode()
    page.set_input_files(
        "[data-test=file-input]",
        files=[{"name": HOSTILE_NAME, "mimeType": "text/plain", "buffer": body}],
    )
    row_with(page, "file-row", "data-name", HOSTILE_NAME)
    seen = cli(TENANT, "exec", sid, "--", "cat", f"/home/user/{HOSTILE_NAME}")
    assert seen.encode() == body
    no_injected_markup(page)
    console.shot("03-files")

    # ---- snapshots: take one, change a file, roll back from the timeline ----
    cli(TENANT, "exec", sid, "--", "sh", "-c", "echo before > /home/user/state.txt")
    page.click("[data-test=tab-snapshots]")
    page.wait_for_selector("[data-test=snapshot-take]")
    # The timeline has loaded once before it is read; rolling snapshots may
    # join it at any time, so the one taken here is the new one taken on request.
    page.wait_for_selector("[data-test=snapshot-list][data-loaded]", state="attached")
    requested = (
        "rows => rows.filter(r => r.getAttribute('data-reason') === 'request')"
        ".map(r => r.getAttribute('data-id'))"
    )
    before = set(page.eval_on_selector_all("[data-test=snapshot-row]", requested))
    page.click("[data-test=snapshot-take]")
    deadline = time.time() + 300
    while True:
        now = set(page.eval_on_selector_all("[data-test=snapshot-row]", requested))
        if now - before:
            break
        assert time.time() < deadline, "the snapshot never showed on the timeline"
        time.sleep(0.5)
    (snap,) = now - before
    cli(TENANT, "exec", sid, "--", "sh", "-c", "echo after > /home/user/state.txt")
    console.shot("04-snapshots")
    row = page.locator(f"[data-test=snapshot-row][data-id='{snap}']")
    row.locator("[data-test=snapshot-rollback]").click()
    page.click("[data-test=confirm-yes]")
    deadline = time.time() + 300
    while True:
        try:
            text = cli(TENANT, "exec", sid, "--", "cat", "/home/user/state.txt")
        except AssertionError:
            text = ""
        if text.strip() == "before":
            break
        assert time.time() < deadline, f"the rollback never took effect: {text!r}"
        time.sleep(1)

    # ---- the other tabs render what the sandbox put there as text ----
    page.click("[data-test=tab-network]")
    page.wait_for_selector("[data-test=egress-save]")
    console.shot("05-network")
    page.click("[data-test=tab-audit]")
    page.wait_for_selector("[data-test=audit-row]")
    console.shot("05-audit")
    page.click("[data-test=tab-logs]")
    page.wait_for_selector("[data-test=logs-pre]")
    no_injected_markup(page)
    console.shot("05-logs")

    # ---- another tenant sees nothing of it ----
    page.click("[data-test=logout]")
    login(console, OTHER)
    page.wait_for_timeout(2000)
    ids = page.eval_on_selector_all(
        "[data-test=sandbox-row]", "rows => rows.map(r => r.getAttribute('data-id'))"
    )
    assert sid not in ids and marked not in ids, ids
    page.goto(f"{URL}/#/sandboxes/{sid}/files")
    wait_until(page, "() => document.body.innerText.toLowerCase().includes('not found')")
    assert page.locator("[data-test=file-row]").count() == 0
    console.shot("06-other-tenant")

    for s in (sid, marked):
        api("DELETE", f"/v1/sandboxes/{s}", TENANT)


def test_the_admin_pages_and_templates_render(console):
    page = console.page
    login(console, ADMIN)
    page.click("[data-test=nav-templates]")
    wait_until(page, "t => document.body.innerText.includes(t)", TEMPLATE)
    console.shot("07-templates")
    page.click("[data-test=nav-admin]")
    row_with(page, "tenant-row", "data-name", "console-acme")
    console.shot("08-admin-tenants")
    for view in ("nodes", "audit"):
        page.goto(f"{URL}/#/admin/{view}")
        page.wait_for_timeout(1500)
        console.shot(f"09-admin-{view}")
