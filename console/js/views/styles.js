// xterm.js's DOM renderer writes its theme (colours, cursor, selection) and its cell sizes
// into <style> elements, which the console's CSP (style-src 'self') does not apply. This
// copies their text into constructed stylesheets (document.adoptedStyleSheets), which the CSP
// allows, and keeps the copies in step. The text is xterm's own, never data from a sandbox.

export function mirrorStyles(root) {
  if (!('adoptedStyleSheets' in Document.prototype)) return () => {};
  const sheets = new Map(); // <style> element → {sheet, text}

  const detach = (sheet) => {
    document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => s !== sheet);
  };

  function sync() {
    for (const el of root.querySelectorAll('style')) {
      let entry = sheets.get(el);
      if (!entry) {
        entry = { sheet: new CSSStyleSheet(), text: null };
        sheets.set(el, entry);
        document.adoptedStyleSheets = [...document.adoptedStyleSheets, entry.sheet];
      }
      const text = el.textContent;
      if (entry.text !== text) {
        entry.text = text;
        try { entry.sheet.replaceSync(text); } catch { /* not CSS: ignore */ }
      }
    }
    for (const [el, entry] of sheets) {
      if (!root.contains(el)) { detach(entry.sheet); sheets.delete(el); }
    }
  }

  // Watch the <style> elements and their parents only: the rows of the terminal change on
  // every write, and watching the whole subtree would re-scan it each time.
  const observer = new MutationObserver(() => { sync(); watch(); });
  function watch() {
    observer.disconnect();
    observer.observe(root, { childList: true });
    for (const el of root.querySelectorAll('style')) {
      observer.observe(el, { childList: true, characterData: true, subtree: true });
      if (el.parentNode) observer.observe(el.parentNode, { childList: true });
    }
  }
  sync();
  watch();
  return () => {
    observer.disconnect();
    for (const { sheet } of sheets.values()) detach(sheet);
    sheets.clear();
  };
}
