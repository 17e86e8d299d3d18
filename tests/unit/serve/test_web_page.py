"""`GET /` of `tr serve` (serve/web_page.py, serve/web/): the page and its files come from the
package, load without the API key while /v1 still needs it, fetch nothing from elsewhere (the
Content-Security-Policy says so too), and the script never turns text into HTML. The page at work
in a browser: tests/e2e/test_web_page.py."""

import re
from html.parser import HTMLParser

import pytest
from starlette.testclient import TestClient

from tr_cli.serve.app import create_app
from tr_cli.serve.requests import ServedModel
from tr_cli.serve.web_page import web_assets
from tr_cli.serve.worker import DecodeWorker


def app(api_key=None):
    model = ServedModel(
        name="tiny",
        aliases=frozenset(),
        tokenizer=None,
        generation_config=None,
        context_length=None,
        max_depth=1,
        vocab_size=8,
        stop_ids=(),
    )
    return create_app(model, DecodeWorker(decoder=None, tokenizer=None, eos_token_ids=[]), api_key=api_key)


@pytest.fixture()
def client():
    with TestClient(app(api_key="sk-page"), raise_server_exceptions=False) as client:
        yield client


class Refs(HTMLParser):
    """The URLs a page loads (scripts, styles, icons, images)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        for name in ("src", "href"):
            if name in attributes and (tag != "a" or name != "href"):
                self.urls.append(attributes[name])


def test_the_page_loads_without_the_key_and_everything_it_loads_is_served_here(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    refs = Refs()
    refs.feed(page.text)
    assert {"/web/app.js", "/web/app.css", "/web/icon.svg"} <= set(refs.urls)
    for url in refs.urls:
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert asset.headers["content-security-policy"] == policy
    assert client.get("/web/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/web/app.css").headers["content-type"].startswith("text/css")
    # /v1 keeps its key: the page asks for it when it gets this 401
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer sk-page"}).status_code == 200


@pytest.mark.parametrize("path", ["/web/missing.js", "/web/..%2Fapp.py", "/web/web_page.py", "/web/"])
def test_only_the_pages_own_files_are_served(client, path):
    response = client.get(path)
    assert response.status_code == 404
    assert "error" in response.json()  # the OpenAI error shape, as every other unknown path


def test_the_page_is_not_in_the_api_document(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert "/" not in paths and not any(p.startswith("/web") for p in paths)


def test_the_package_holds_the_pages_files_and_they_fetch_nothing_from_elsewhere():
    assets = web_assets()
    assert {"index.html", "app.js", "app.css", "icon.svg"} <= set(assets)
    for name, (body, _) in assets.items():
        text = body.decode("utf-8")
        external = re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"')]*", text)
        assert [url for url in external if "www.w3.org/2000/svg" not in url] == [], name


def test_the_script_never_writes_html():
    script = web_assets()["app.js"][0].decode("utf-8")
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script, sink


class NumberFields(HTMLParser):
    """The page's number inputs: id -> their attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, dict] = {}

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        if tag == "input" and attributes.get("type") == "number":
            self.fields[attributes["id"]] = attributes


def test_a_setting_takes_any_value_in_its_range():
    """The page sends a setting only when its field is valid; a step other than "any" made usual
    values invalid (repetition penalty 1.1 with min 0.01 and step 0.05, temperature 0.75 with step
    0.1), which were then silently left out of the request. Whole numbers stay whole."""
    fields = NumberFields()
    fields.feed(web_assets()["index.html"][0].decode("utf-8"))
    assert set(fields.fields) == {"temperature", "top_p", "top_k", "repetition_penalty", "max_tokens", "seed"}
    whole = {"top_k", "max_tokens", "seed"}
    for name, attributes in fields.fields.items():
        assert attributes.get("step") == ("1" if name in whole else "any"), name
