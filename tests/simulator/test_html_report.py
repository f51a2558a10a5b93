"""report.html: one self-contained page per results folder (simulator/report/html.py).

The static tests always run: the page is well-formed, fetches nothing (no http(s) URL, every
image a PNG data URI), and leads with the headline the folder's JSON implies. The browser test
opens the pages in a headless Chromium through Playwright (the optional ``browser`` extra and a
system ``chromium``) and skips, saying which is absent, where they are not installed.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from simulator.commands.capacity.cmd import run_capacity
from simulator.cli import main
from simulator.report.html import REPORT_NAME, write_report

ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VOID = {"meta", "img", "br", "hr", "link", "input", "col", "wbr", "source", "area", "base"}
CELLS = {"td", "th", "li", "p", "tr", "h1", "h2", "h3", "figcaption"}  # a space between their texts

# A small run of the bundled Azure conversation trace: two allocators, seconds to simulate.
SCENARIO = """\
name: report
seed: 0
model: llama-3.1-8b
gpu: h100-80gb
allocators: [paged, contiguous-max]
max_model_len: 8192
workload:
  trace: bundled:azure-conv
  rate_scale: 3.0
  num_requests: 150
slo: {ttft_p99_s: 2.0, tpot_p99_s: 0.1, max_rejected_fraction: 0.01}
"""


class Page(HTMLParser):
    """The page's structure: tags balanced (void elements aside), ids, links, images, text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.ids: list[str] = []
        self.hrefs: list[str] = []
        self.images: list[str] = []
        self.tags: list[str] = []
        self.chunks: list[str] = []
        self.feed(text)
        self.close()
        if self.stack:
            self.errors.append(f"unclosed at the end: {self.stack}")

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        self.tags.append(tag)
        if values.get("id"):
            self.ids.append(values["id"] or "")
        if tag == "a":
            self.hrefs.append(values.get("href") or "")
        if tag == "img":
            self.images.append(values.get("src") or "")
        if tag not in VOID:
            self.stack.append(tag)
        if tag in CELLS:
            self.chunks.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in CELLS:
            self.chunks.append(" ")
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1] if self.stack else 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.chunks.append(data)

    @property
    def text(self) -> str:
        return " ".join("".join(self.chunks).split())


def check_static(path: Path) -> Page:
    """What every report must be: well-formed, self-contained, its contents table resolving."""
    text = path.read_text(encoding="utf-8")
    page = Page(text)
    assert page.errors == []
    assert not re.search(r"https?://", text), "the page must fetch nothing"
    assert {"script", "link", "iframe"}.isdisjoint(page.tags)
    assert len(page.ids) == len(set(page.ids))
    for href in page.hrefs:
        assert href.startswith("#") and href[1:] in page.ids, href
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG_MAGIC
    return page


def simulate(tmp: Path, *extra: str) -> Path:
    (tmp / "report.yaml").write_text(SCENARIO)
    out = tmp / "run"
    assert main(["simulate", str(tmp / "report.yaml"), "--out", str(out), "--quiet", *extra]) == 0
    return out


@pytest.fixture(scope="module")
def simulate_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return simulate(tmp_path_factory.mktemp("simulate"))


@pytest.fixture(scope="module")
def capacity_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real capacity search (one point, two allocators, 150 requests a probe)."""
    tmp = tmp_path_factory.mktemp("capacity")
    (tmp / "report.yaml").write_text(SCENARIO)
    out = tmp / "capacity"
    run_capacity(str(tmp / "report.yaml"), out=str(out), jobs=1, use_cache=False, quiet=True)
    return out


@pytest.fixture(scope="module")
def validate_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("validate") / "validate"
    assert main(["validate", "--source", "vllm-ci", "--out", str(out), "--quiet"]) == 0
    return out


# --- simulate ---------------------------------------------------------------------------------------


def test_simulate_writes_a_self_contained_report_with_every_plot(simulate_run: Path) -> None:
    page = check_static(simulate_run / REPORT_NAME)
    assert len(page.images) == len(list(simulate_run.glob("*.png"))) == 4
    summary = json.loads((simulate_run / "summary.json").read_text())
    # the headline: one row per allocator, its p99 TTFT in ms (< 1 s here) and KV peak
    for alloc, s in summary.items():
        ttft_ms = s["ttft_s"]["p99"] * 1000
        assert ttft_ms < 1000
        shown = f"{ttft_ms:.1f} ms" if ttft_ms < 100 else f"{ttft_ms:.0f} ms"
        peak = f"{s['kv']['peak_token_state']:.1%}"
        assert re.search(rf"{alloc} [\d.,]+ [\d,]+ {re.escape(shown)} [\d.]+ m?s {re.escape(peak)} 0 stable",
                         page.text), alloc
    head = page.text.split("Contents")[0]
    assert "Llama-3.1-8B on H100-80GB × TP 1" in head
    # 150 requests load one H100 lightly: both allocators meet the SLO, the lower p99 TTFT named
    fastest = min(summary, key=lambda a: summary[a]["ttft_s"]["p99"])
    assert ("Every allocator meets the SLO (p99 TTFT ≤ 2 s, p99 TPOT ≤ 100 ms, ≤ 1% rejected); "
            f"the lowest p99 TTFT: {fastest} (") in head
    for section in ("Scenario", "Results per allocator", "Plots", "Caveats"):
        assert section in page.text
    assert "Latency model: roofline" in page.text and "held-out source" in page.text


def test_no_allocator_is_called_best_when_none_meets_the_slo(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A TPOT bound no allocator meets: the printed table's headline and the page's say so and
    what each misses, and name no lowest p99 TTFT."""
    (tmp_path / "report.yaml").write_text(SCENARIO)
    out = tmp_path / "run"
    assert main(["simulate", str(tmp_path / "report.yaml"), "--out", str(out), "--no-plots",
                 "--set", "slo.tpot_p99_s=0.001"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    head = check_static(out / REPORT_NAME).text.split("Contents")[0]
    for text in (printed, head):
        assert "No allocator meets the SLO (p99 TTFT ≤ 2 s, p99 TPOT ≤ 1 ms, ≤ 1% rejected): " in text
        for alloc, s in summary.items():
            assert f"{alloc} misses p99 TPOT ({s['tpot_s']['p99'] * 1e3:.3g} ms > 1 ms)" in text
        assert "lowest p99 TTFT" not in text.lower()


def test_the_best_is_chosen_among_those_that_meet_the_slo() -> None:
    """The lowest p99 TTFT of all misses the TPOT bound: the headline names the other, the one
    that meets the SLO, and says what the first misses (a saturated queue counts as a miss, as
    in capacity's search)."""
    from simulator.report.summary import slo_headline

    def run(ttft: float, tpot: float, **more: object) -> dict[str, object]:
        return {"completed": 990, "rejected": 10, "ttft_s": {"p99": ttft}, "tpot_s": {"p99": tpot},
                "e2e_s": {"p99": 20.0}, **more}

    slo = {"ttft_p99_s": 2.0, "tpot_p99_s": 0.04, "max_rejected_fraction": 0.01}
    summary = {"paged": run(0.5, 0.041), "contiguous-oracle": run(0.9, 0.03),
               "contiguous-max": run(95.0, 0.02, saturated=True, queue_growth_s_per_s=0.094),
               "contiguous-pow2": run(1.0, 0.03, rejected=30)}
    assert slo_headline(summary, slo) == (
        "Only contiguous-oracle meets the SLO (p99 TTFT ≤ 2 s, p99 TPOT ≤ 40 ms, ≤ 1% rejected). "
        "paged misses p99 TPOT (41 ms > 40 ms); contiguous-max misses p99 TTFT (95 s > 2 s) and a "
        "stable queue (saturated: it grows +0.09 s/s); contiguous-pow2 misses the rejected share "
        "(2.94% of requests > 1%).")  # 30 of 1,020
    # a p99 that rounds to its bound is written with the digits that tell them apart
    assert "p99 TPOT (40.02 ms > 40 ms)" in slo_headline({"paged": run(0.5, 0.04002)}, slo)
    summary["paged"] = run(0.5, 0.039)
    assert slo_headline(summary, slo).startswith(
        "paged, contiguous-oracle meet the SLO (p99 TTFT ≤ 2 s, p99 TPOT ≤ 40 ms, ≤ 1% rejected); "
        "the lowest p99 TTFT among them: paged (500 ms). contiguous-max misses")
    assert slo_headline(summary, None) == "No SLO in the scenario; lowest p99 TTFT: paged (500 ms)."


def test_simulate_without_plots_says_so(tmp_path: Path) -> None:
    out = simulate(tmp_path, "--no-plots", "--allocator", "paged")
    page = check_static(out / REPORT_NAME)
    assert page.images == []
    assert "--no-plots" in page.text


def test_the_report_is_byte_identical_for_the_same_run(simulate_run: Path, tmp_path: Path) -> None:
    again = simulate(tmp_path)
    assert (again / REPORT_NAME).read_bytes() == (simulate_run / REPORT_NAME).read_bytes()


def test_rejected_requests_are_explained(tmp_path: Path) -> None:
    # max_model_len 1,024: the trace's longer requests are refused at arrival
    (tmp_path / "report.yaml").write_text(SCENARIO.replace("max_model_len: 8192", "max_model_len: 1024"))
    out = tmp_path / "run"
    assert main(["simulate", str(tmp_path / "report.yaml"), "--out", str(out), "--quiet", "--no-plots",
                 "--allocator", "paged"]) == 0
    rejected = json.loads((out / "summary.json").read_text())["paged"]["rejected"]
    assert rejected > 0
    text = check_static(out / REPORT_NAME).text
    assert f"paged: {rejected:,} requests rejected at arrival ({rejected:,} max_model_len)" in text
    assert f"policy reject: {rejected:,} requests longer than the window refused" in text


def test_a_folder_missing_its_files_gets_a_report_that_says_so(tmp_path: Path) -> None:
    page = check_static(write_report(tmp_path, "simulate"))
    assert "No headline: summary.json is missing" in page.text
    assert "summary.json: not in the folder" in page.text and "run.json: not in the folder" in page.text


# --- capacity, validate, compare -------------------------------------------------------------------


def test_capacity_report_leads_with_the_highest_rates(capacity_run: Path) -> None:
    rows = json.loads((capacity_run / "capacity.json").read_text())["rows"]
    page = check_static(write_report(capacity_run, "capacity"))
    assert len(page.images) == len(list((capacity_run / "plots").rglob("*.png"))) >= 1
    best = sorted(rows, key=lambda r: -r["max_rate_req_s"])
    rate = best[0]["max_rate_req_s"]
    assert 10 <= rate < 100  # one decimal in the headline
    head = page.text.split("Contents")[0]
    assert f"{best[0]['allocator']} holds {rate:.1f} req/s" in head
    assert best[1]["allocator"] in head


def test_capacity_report_reads_the_scenario_when_the_folder_records_it(capacity_run: Path,
                                                                      tmp_path: Path) -> None:
    folder = tmp_path / "capacity"
    shutil.copytree(capacity_run, folder)
    body = json.loads((folder / "capacity.json").read_text())
    body["scenario"] = yaml.safe_load(SCENARIO)
    (folder / "capacity.json").write_text(json.dumps(body))
    page = check_static(write_report(folder, "capacity"))
    assert "at p99 TTFT ≤ 2 s, p99 TPOT ≤ 100 ms" in page.text.split("Contents")[0]
    assert "kvplan capacity — report" in page.text and "Validated against" in page.text


def test_capacity_scenario_shows_the_swept_values_that_ran(tmp_path: Path) -> None:
    """--sweep replaces the base scenario's value (H100, block 16): the scenario table says
    what the points ran, not the file's base."""
    (tmp_path / "report.yaml").write_text(SCENARIO)
    out = tmp_path / "capacity"
    run_capacity(str(tmp_path / "report.yaml"), out=str(out), jobs=1, use_cache=False, quiet=True,
                 allocators=["paged"], num_seeds=1, plots_on=False,
                 sweeps=["gpu=h200", "block_size=16,32"])
    scenario = check_static(out / REPORT_NAME).text.split("Scenario", 2)[2].split("Capacity table")[0]
    assert "GPU h200 " in scenario and "h100" not in scenario
    assert "block size 16, 32 (swept: one per sweep point, the table says which)" in scenario
    assert "model llama-3.1-8b " in scenario  # not swept: the base scenario's, which ran


def test_validate_writes_its_report(validate_run: Path) -> None:
    body = json.loads((validate_run / "validate.json").read_text())["summary"]
    page = check_static(validate_run / REPORT_NAME)
    assert len(page.images) == 1
    head = page.text.split("Contents")[0]
    assert f"{body['num_simulated']} of {body['num_rows']} published measurements" in head
    assert f"mean absolute error {body['in_sample']['overall']['mape']:.1%}" in head
    assert "Largest errors" in page.text


def test_compare_renders_any_tables_and_escapes_text(tmp_path: Path, simulate_run: Path) -> None:
    shutil.copy(simulate_run / "latency_cdf.png", tmp_path / "overlay.png")
    (tmp_path / "compare.json").write_text(json.dumps({
        "headline": "<b>fp8</b> holds 12% more & sooner",
        "metrics": [{"metric": "ttft_p99_s", "a": 0.5, "b": 0.25}, {"metric": "tpot_p99_s", "a": 0.02}],
        "runs": {"a": {"kv_cache_dtype": "fp16"}, "b": {"kv_cache_dtype": "fp8"}},
    }))
    text = (write_report(tmp_path, "compare")).read_text()
    page = check_static(tmp_path / REPORT_NAME)
    assert "&lt;b&gt;fp8&lt;/b&gt; holds 12% more &amp; sooner" in text and "<b>fp8</b>" not in text
    assert len(page.images) == 1
    assert "ttft_p99_s 0.5 0.25" in page.text and "tpot_p99_s 0.02 —" in page.text
    assert "a fp16" in page.text and "b fp8" in page.text


def test_compare_without_its_json_says_what_is_missing(tmp_path: Path) -> None:
    page = check_static(write_report(tmp_path, "compare"))
    assert "compare.json: not in the folder" in page.text and "No plots in the folder" in page.text


# --- in a real browser -------------------------------------------------------------------------------


def test_reports_render_in_a_headless_browser(simulate_run: Path, capacity_run: Path,
                                              validate_run: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed "
                                   "(pip install -e '.[browser]')")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium)")
    write_report(capacity_run, "capacity")
    reports = {simulate_run: "meets the SLO", capacity_run: " req/s",
               validate_run: "published measurements"}
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: errors.append(f"fetched {r.url}")
                    if not r.url.startswith(("file:", "data:")) else None)
            for folder, headline in reports.items():
                page.goto((folder / REPORT_NAME).as_uri(), wait_until="load")
                widths = page.evaluate("Array.from(document.images, i => i.complete ? i.naturalWidth : 0)")
                assert widths and all(w > 0 for w in widths), folder
                assert headline in page.inner_text("#headline")
            assert errors == []
        finally:
            browser.close()
