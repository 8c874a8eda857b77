"""The e2b-desktop SDK's calls on one desktop: what each call does is read back from the X
server (an `xev` window's event log, the cursor, the window list), not taken on trust."""

import io
import time

import pytest
from e2b import CommandExitException, SandboxException
from e2b_desktop import Sandbox
from PIL import Image, ImageStat

from conftest import MARK, EventLog, until, until_equal


def png(data):
    img = Image.open(io.BytesIO(bytes(data)))
    img.load()
    return img


def not_blank(img):
    """Whether `img` shows something: more than one colour, and some spread."""
    rgb = img.convert("RGB")
    return len(rgb.getcolors(maxcolors=1 << 16) or [0, 0]) > 1 and max(
        ImageStat.Stat(rgb).stddev
    ) > 2.0


def focused_window(desktop):
    """The focused window's id, or None while the focus is on the root (between a click
    and the window manager's focus change, X reports the focus as PointerRoot and
    `xdotool getwindowfocus` exits 1)."""
    try:
        return desktop.get_current_window_id()
    except CommandExitException as e:
        if "focused window of 1" in str(e):
            return None
        raise


def test_the_desktop_is_up_after_create(desktop):
    # What the SDK started in the background outlives its client: the X server and Xfce.
    for proc in ["Xvfb", "xfce4-session", "xfwm4", "xfdesktop"]:
        assert desktop.commands.run(f"pgrep -x {proc}").exit_code == 0, proc
    assert desktop.get_screen_size() == (1024, 768)


def test_create_time_environment_reaches_every_process(desktop):
    r = desktop.commands.run('echo "$DISPLAY $SPACE_MARK"')
    assert r.stdout.strip() == f":0 {MARK}"
    # A background process sees it too, and so does one started by a new client.
    desktop.commands.run(
        'sh -c \'echo "$SPACE_MARK" > /tmp/mark-bg\'', background=True
    ).wait()
    assert desktop.files.read("/tmp/mark-bg").strip() == MARK
    again = Sandbox.connect(desktop.sandbox_id)
    assert again.commands.run("echo $SPACE_MARK").stdout.strip() == MARK


def test_screenshot_as_bytes_and_as_a_stream(desktop):
    img = png(desktop.screenshot())
    assert img.format == "PNG" and img.size == (1024, 768)
    # Xfce's processes run when create returns; the desktop paints a little later.
    until(
        "the desktop paints (a screenshot that is not one flat colour)",
        lambda: not_blank(png(desktop.screenshot())),
        timeout=120,
        interval=2,
    )
    chunks = list(desktop.screenshot(format="stream"))
    assert chunks and all(isinstance(c, (bytes, bytearray)) for c in chunks)
    assert png(b"".join(chunks)).size == (1024, 768)
    # The SDK removes its file after reading it.
    left = desktop.commands.run("ls /tmp | grep -c '^screenshot-' || true").stdout
    assert left.strip() == "0"


def test_mouse_moves_and_reports_where_it_is(desktop):
    desktop.move_mouse(321, 234)
    assert desktop.get_cursor_position() == (321, 234)
    desktop.move_mouse(10, 700)
    assert desktop.get_cursor_position() == (10, 700)


def test_every_button_reaches_the_window_under_the_cursor(desktop):
    log = EventLog(desktop, "buttons")
    x, y = log.center
    try:
        # Each at its own point: xdotool's `mousemove --sync` to where the pointer already is
        # waits for a move that never comes (seconds).
        desktop.left_click(x, y)
        assert desktop.get_cursor_position() == (x, y)
        desktop.right_click(x + 10, y)
        desktop.middle_click(x + 20, y)
        desktop.double_click(x + 30, y)
        assert desktop.get_cursor_position() == (x + 30, y)
        desktop.scroll("up", 2)
        desktop.scroll("down")
        desktop.scroll(amount=3)
        desktop.mouse_press("right")
        desktop.mouse_release("right")
        want = [1, 3, 2, 1, 1, 4, 4, 5, 5, 5, 5, 3]
        until_equal("every press logged", log.buttons, want, timeout=30)
        assert log.buttons("ButtonRelease") == want
    finally:
        log.close()


def test_drag_presses_moves_and_releases(desktop):
    log = EventLog(desktop, "drag", x=140, y=120)
    bx, by, w, h = log.box
    start = (bx + 20, by + 20)
    end = (bx + w - 20, by + h - 20)
    try:
        desktop.drag(start, end)
        assert desktop.get_cursor_position() == end
        until_equal("the drag logged", lambda: log.buttons("ButtonRelease"), [1], 30)
        text = log.text()
        press = text.index("ButtonPress event")
        release = text.index("ButtonRelease event")
        # The pointer moved with the button down (state 0x100: Button1Mask).
        motion = text.find("MotionNotify event", press)
        assert press < motion < release
        assert "state 0x100" in text[motion:release]
    finally:
        log.close()


def test_write_and_press_type_into_the_focused_window(desktop):
    log = EventLog(desktop, "keys", x=180, y=140)
    try:
        desktop.left_click(*log.center)
        until(
            "the xev window has the focus",
            lambda: focused_window(desktop) == log.window,
            30,
        )
        # Two chunks of the SDK's default size, with a quote and a space in them.
        text = "it's typed: 0123456789 abcdefghijk"
        desktop.write(text, chunk_size=25, delay_in_ms=5)
        desktop.press("enter")
        desktop.press(["ctrl", "a"])
        want = {
            " ": "space", "'": "apostrophe", ":": "colon",
        }
        typed = [want.get(c, c) for c in text]
        expect = typed + ["Return", "Control_L", "a"]
        until_equal(
            "every key logged",
            lambda: [k for k in log.keys() if k != "Shift_L"],
            expect,
            timeout=30,
        )
    finally:
        log.close()


def test_windows_are_named_and_focused(desktop):
    log = EventLog(desktop, "windows", x=220, y=160)
    try:
        assert desktop.get_window_title(log.window) == log.title
        desktop.left_click(*log.center)
        until(
            "the clicked window has the focus",
            lambda: focused_window(desktop) == log.window,
            30,
        )
    finally:
        log.close()


def test_launch_starts_an_application_whose_windows_are_listed(desktop):
    # No window of the class yet: xdotool finds none and exits 1.
    with pytest.raises(CommandExitException):
        desktop.get_application_windows("xfce4-terminal")
    desktop.launch("xfce4-terminal")

    def windows():
        try:
            return desktop.get_application_windows("xfce4-terminal")
        except CommandExitException:
            return None

    windows = until("the terminal's window shows", windows, timeout=120, interval=2)
    assert "Terminal" in desktop.get_window_title(windows[0])
    desktop.commands.run("pkill -x xfce4-terminal || true")


def test_open_hands_a_url_to_the_default_browser(desktop):
    # Xfce's exo-open hands a URL to the preferred browser (Firefox ESR, started through the
    # x-www-browser alternative).
    desktop.open("http://localhost:9/")
    until(
        "a browser process runs",
        lambda: desktop.commands.run(
            "pgrep -x 'x-www-browser|firefox-esr|chromium' || true"
        ).stdout.strip(),
        timeout=120,
        interval=2,
    )
    desktop.commands.run("pkill -x 'x-www-browser|firefox-esr|chromium' || true")


def test_wait_sleeps_inside_the_sandbox(desktop):
    t = time.monotonic()
    desktop.wait(1500)
    assert time.monotonic() - t >= 1.5


def test_another_tenant_cannot_reach_the_desktop(desktop, other_key):
    with pytest.raises(SandboxException):
        Sandbox.connect(desktop.sandbox_id, api_key=other_key)
