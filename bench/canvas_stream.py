"""Benchmark: a run's events streaming onto the canvas page (issue #25: the canvas stays smooth
while a run logs).

A real server (with the ``Flood`` custom node, which logs ``--events`` lines as fast as it can)
serves web/canvas.html; headless Chromium (``/usr/bin/chromium``, software rendering) opens it
through Playwright, opens the Flood graph in a tab and clicks Run (``POST /api/canvas/run``). From
the first logged line shown in the page's execution log until the run's last event is there, the page
counts its animation frames; measured:

- frames per second while the events arrive (what the page drew, the editor included);
- the longest gap between two frames in that time (a stall the eye sees);
- events shown per second in that time;
- the log's rows in the page at the end (the log is virtual: a window of the lines, not all of them).

    .venv/bin/python bench/canvas_stream.py [--events 10000]
"""
from __future__ import annotations

from pathlib import Path

from common import Figure, flood_graph, install_flood, parser, report, say, server

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]

# From the first log line shown in the execution log until stop(): the animation frames the page
# drew and the longest gap between two of them.
START = """() => {
  const st = {frames: 0, maxGap: 0, last: 0, t0: 0, on: true, times: []};
  const step = (now) => {
    if (!st.on) return;
    if (!st.t0 && document.querySelector('#canvas-log li.ev-log')) { st.t0 = now; st.last = now; }
    if (st.t0) {
      st.frames++;
      st.times.push(now);
      st.maxGap = Math.max(st.maxGap, now - st.last);
      st.last = now;
    }
    requestAnimationFrame(step);
  };
  requestAnimationFrame(step);
  window.__streamBench = st;
}"""
STOP = """() => { const st = window.__streamBench; st.on = false;
  // The slowest second: the fewest frames drawn in any one-second window of the stream (each window
  // starting at a frame and lying wholly inside it), which is what "never below 30 frames/s" is about.
  const t = st.times; let slowest = null;
  for (let i = 0, j = 0; i < t.length && t[i] + 1000 <= t[t.length - 1]; i++) {
    while (j < t.length && t[j] < t[i] + 1000) j++;
    slowest = slowest === null ? j - i : Math.min(slowest, j - i);
  }
  return {frames: st.frames, seconds: (performance.now() - st.t0) / 1000, maxGap: st.maxGap, slowest,
          rows: document.querySelectorAll('#canvas-log li').length}; }"""


def main() -> int:
    p = parser(__doc__)
    p.add_argument("--events", type=int, default=10000)
    a = p.parse_args()
    n = 500 if a.smoke else a.events
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"{CHROMIUM} is missing (apt-get install chromium): the canvas bench drives a real browser")
    from playwright.sync_api import sync_playwright

    B = "canvas"
    with server(prepare=lambda s: install_flood(s.data_dir)) as srv, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(300_000)
        page.goto(srv.url + "/web/canvas.html")
        page.wait_for_selector("body[data-ready='1']")
        page.evaluate("(g) => window.cduiCanvas.tabs.open(g, 'flood')", flood_graph(n))
        say(f"a canvas Run that logs {n} events, streaming onto the page")
        page.evaluate(START)
        page.click("#canvas-run")
        page.wait_for_selector("#canvas-run-title a")
        run_id = (page.get_attribute("#canvas-run-title a", "href") or "").removeprefix("/#run=")
        page.wait_for_selector("#canvas-run-status .badge.status-succeeded")
        run = srv.call("GET", f"/api/runs/{run_id}")
        if run["status"] != "succeeded":
            raise RuntimeError(f"canvas run {run_id} ended {run['status']}: {run['error']}")
        last = run["last_seq"]
        page.wait_for_selector(f"#canvas-log li[data-seq='{last}']", state="attached")
        r = page.evaluate(STOP)
        browser.close()
    if last < n:
        raise RuntimeError(f"the run has {last} events: fewer than the {n} lines it should have logged")
    note = f"{last} events, {r['frames']} frames in {r['seconds']:.1f} s, headless Chromium, software rendering"
    figs = [Figure(B, f"{n} events of a Run streaming onto the canvas: frames per second", r["frames"] / r["seconds"],
                   "frames/s", 50, "higher", note=note),
            # The issue's own figure: the stream never drops below 30 frames/s, counted over each second.
            *([Figure(B, f"{n} events streaming: the slowest second (fewest frames in any 1 s window of the stream)",
                      r["slowest"], "frames/s", 30, "higher")] if r["slowest"] is not None else []),
            Figure(B, f"{n} events streaming: longest gap between two frames", r["maxGap"], "ms", 100,
                   note="one late frame on a 2-core machine shared with the server and the run; the slowest "
                        "second above is the goal's own measure"),
            Figure(B, f"{n} events streaming: events shown per second", last / r["seconds"],
                   "events/s", None, "higher"),
            Figure(B, f"{n} events streamed: log rows in the page at the end", r["rows"], "rows", None,
                   note="the execution log keeps only the lines in view (and a margin) in the page")]
    report(figs, a.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
