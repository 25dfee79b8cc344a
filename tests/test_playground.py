"""The playground page at ``/``, driven in a real browser (headless Chromium through Selenium): a streamed
answer's coloured tokens are the stream's text and ``token_origins``, token for token; the compare toggle shows
the same greedy text without speculation. The server runs as in ``test_serve_speculation`` (HTTP here, the
engine in its own process with an oracle head that drafts the plain output, so drafts are accepted), with an
API key: the page is served without it and sends it on its own calls. Without Chromium, chromedriver or
selenium the browser tests are skipped, saying which is missing; the page's files and ``/v1/server_info`` are
checked over HTTP either way."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_serve import KEY, request, sse
from test_serve_faults import Server

from peagle.engine.llm_engine import LLMEngine
from peagle.engine.sampling import SamplingParams
from peagle.engine.tree import Tree
from peagle.serve.async_engine import AsyncEngine, EngineSpec
from peagle.serve.playground import PAGES, STATIC

TREE = "[(0,), (1,), (0, 0), (1, 0), (0, 1), (0, 0, 0)]"
PROMPTS = ["Tell me a story.", "Name three colours."]
MAX_TOKENS = 24   # the page's field, set by the tests; greedy (the page's default temperature, 0)
WAIT_S = 120


@pytest.fixture(scope="module")
def srv(tiny_chat_dir, tmp_path_factory):
    """P-EAGLE (K=3 over a token tree) with an oracle head that drafts each prompt's greedy output, behind ``KEY``."""
    plain = LLMEngine.from_pretrained(str(tiny_chat_dir), method="none", dtype="float32")
    cases = [(plain.encode_prompt(p), vars(SamplingParams(max_tokens=MAX_TOKENS, temperature=0))) for p in PROMPTS]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PEAGLE_CACHE", str(tmp_path_factory.mktemp("cache")))
        from speculation import oracle_engine
        spec = EngineSpec(dict(target=str(tiny_chat_dir), cases=cases, method="parallel", num_speculative_tokens=3,
                               speculative_token_tree=TREE, max_num_seqs=4, max_model_len=256), oracle_engine)
        server = Server(AsyncEngine(spec, max_queue=8), api_key=KEY)
    yield server
    server.close()


def test_the_page_is_served_without_the_key_and_its_server_info_with_it(srv):
    """The page's three files without the key (they hold no data), nothing in them fetched from elsewhere
    (it works offline); ``/v1/server_info`` needs the key and tells the model and how it speculates."""
    for path, (name, media_type) in PAGES.items():
        status, body, headers = request(srv.port, "GET", path, key=None)
        assert status == 200 and headers["content-type"] == media_type, (path, status)
        assert body == (STATIC / name).read_text()
        assert "http://" not in body and "https://" not in body, f"{name} names a resource elsewhere"
    assert request(srv.port, "GET", "/v1/server_info", key=None)[0] == 401
    status, info, _ = request(srv.port, "GET", "/v1/server_info")
    assert status == 200, info
    assert info == {"model": "tiny", "method": "parallel", "num_speculative_tokens": 3, "max_speculative_tokens": 3,
                    "speculative_token_tree": str(Tree.parse(TREE)),
                    "device": "cpu", "precision": info["precision"], "kernels": info["kernels"],
                    "cuda_graphs": False, "max_model_len": 256}


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium through the system's chromedriver (Debian: ``apt-get install chromium chromium-driver``)."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        pytest.skip("Chromium or chromedriver is not installed (apt-get install -y chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,860"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
    yield driver
    driver.quit()


def open_page(browser, srv):
    """The page, fresh (no conversation), with the key typed in and the server's line shown; greedy, MAX_TOKENS."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"http://127.0.0.1:{srv.port}/")
    key = browser.find_element(By.ID, "api_key")
    key.clear()
    key.send_keys(KEY, Keys.TAB)   # its change event: the page asks for /v1/server_info with the key
    WebDriverWait(browser, WAIT_S).until(lambda d: "P-EAGLE" in d.find_element(By.ID, "server").text)
    tokens = browser.find_element(By.ID, "max_tokens")
    tokens.clear()
    tokens.send_keys(str(MAX_TOKENS))
    return browser.find_element(By.ID, "prompt")


def answers(browser, n: int) -> list[dict]:
    """Once ``n`` answers have ended: each one's token spans as (text, origin), and its error if any."""
    from selenium.webdriver.support.ui import WebDriverWait

    done = "return [...document.querySelectorAll('.answer')].filter(a => a.getAttribute('aria-busy') === 'false').length"
    WebDriverWait(browser, WAIT_S).until(lambda d: d.execute_script(done) >= n)
    return browser.execute_script("""return [...document.querySelectorAll('.answer')].map(a => ({
        tokens: [...a.querySelectorAll('.text .tok')].map(s => [s.textContent, Number(s.dataset.origin)]),
        error: a.querySelector('.error') && a.querySelector('.error').textContent,
        bars: a.querySelectorAll('.bar').length}))""")


def reference(srv, prompt: str, speculative: bool = True) -> tuple[str, list[list]]:
    """The stream's text and token_origins for the request the page sends."""
    events = sse(srv.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                                    "max_tokens": MAX_TOKENS, "temperature": 0, "top_p": 1,
                                                    "token_origins": True, "speculative": speculative})
    choices = [c for e in events for c in e["choices"]]
    return ("".join(c["delta"]["content"] for c in choices),
            [[t["text"], t["origin"]] for c in choices for t in c["token_origins"]])


def test_the_playground_colours_each_streamed_token_by_its_origin(srv, browser, tmp_path):
    """Enter sends; the answer's spans add up to the stream's text and carry its origins (drafts accepted at
    several positions, as the oracle drafts the greedy output); the per-position bars show K positions."""
    from selenium.webdriver.common.keys import Keys

    open_page(browser, srv).send_keys(PROMPTS[0], Keys.ENTER)
    [answer] = answers(browser, 1)
    assert answer["error"] is None
    text, origins = reference(srv, PROMPTS[0])
    assert "".join(t for t, _ in answer["tokens"]) == text and text
    assert answer["tokens"] == origins
    assert {o for _, o in origins} >= {1, 2, -2}, origins
    assert answer["bars"] == 3
    browser.save_screenshot(str(tmp_path / "playground.png"))
    assert (tmp_path / "playground.png").stat().st_size > 0


def test_compare_shows_the_same_greedy_text_without_speculation(srv, browser, tmp_path):
    """Ctrl+Enter sends; with compare on, the same prompt without speculation follows: the same text, every
    token of it from a round without drafts, and the page says they are the same."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    prompt = open_page(browser, srv)
    browser.find_element(By.ID, "compare").click()
    prompt.send_keys(PROMPTS[1], Keys.CONTROL, Keys.ENTER)
    spec, plain = answers(browser, 2)
    assert spec["error"] is None and plain["error"] is None
    assert "".join(t for t, _ in spec["tokens"]) == "".join(t for t, _ in plain["tokens"]) == reference(srv, PROMPTS[1])[0]
    assert any(o >= 1 for _, o in spec["tokens"]) and all(o == -2 for _, o in plain["tokens"])
    assert plain["tokens"] == reference(srv, PROMPTS[1], speculative=False)[1]
    assert browser.find_element(By.CSS_SELECTOR, ".verdict").get_attribute("data-same") == "true"
    browser.save_screenshot(str(tmp_path / "compare.png"))
