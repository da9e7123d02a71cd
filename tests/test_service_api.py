"""The service's documentation of itself: its OpenAPI document (error answers, field
descriptions, the receipt's real schema), the docs pages served offline, and the README's curl
examples run against the app as written."""

import re
import shlex
import shutil
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from pipecat_rl.service import docs
from pipecat_rl.service.app import create_app
from pipecat_rl.service.settings import ServiceSettings
from pipecat_rl.simulator.options import GATE_REPEATS

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "api-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def settings(tmp_path: Path) -> ServiceSettings:
    return ServiceSettings(data_dir=tmp_path, ledger=tmp_path / "ledger.db", token=TOKEN,
                           poll_s=0.05)  # fmt: skip


@pytest.fixture
def client(tmp_path):
    with TestClient(create_app(settings(tmp_path))) as c:
        yield c


@pytest.fixture
def spec(client) -> dict:
    r = client.get("/openapi.json")  # no token: the API's shape is no secret
    assert r.status_code == 200
    return r.json()


def _operations(spec: dict):
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            yield path, method, op


def _schemas_under(spec: dict, schema: dict) -> list[str]:
    """The named schemas a body schema refers to (through a union of job kinds, say)."""
    found = []
    for value in [schema, *schema.get("oneOf", []), *schema.get("anyOf", [])]:
        if "$ref" in value:
            found.append(value["$ref"].rsplit("/", 1)[-1])
    return found


def test_every_operation_declares_the_errors_it_can_answer(spec):
    declared = {(m, p): set(op["responses"]) for p, m, op in _operations(spec)}
    assert all("401" in codes for codes in declared.values())  # the token guards everything
    for post in (("post", "/jobs"), ("post", "/live")):
        assert {"202", "403", "413", "422"} <= declared[post]
    assert {"404"} <= declared[("get", "/jobs/{job_id}")]
    assert {"200", "202", "404", "409"} <= declared[("delete", "/jobs/{job_id}")]
    assert {"400", "404"} <= declared[("get", "/receipts/{receipt_id}")]
    error = spec["paths"]["/jobs/{job_id}"]["delete"]["responses"]["409"]
    assert error["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorView")
    assert "already ended" in error["description"]


def test_every_request_field_has_a_description(spec):
    bodies = set()
    for _, _, op in _operations(spec):
        body = op.get("requestBody", {}).get("content", {}).get("application/json")
        if body:
            bodies.update(_schemas_under(spec, body["schema"]))
    assert {"SimulateJob", "TrainJob", "GateJob", "PromoteJob", "RollbackJob", "CycleJob",
            "LiveMoveRequest"} <= bodies  # fmt: skip
    undocumented = [
        f"{name}.{field}"
        for name in sorted(bodies)
        for field, schema in spec["components"]["schemas"][name]["properties"].items()
        if not schema.get("description")
    ]
    assert undocumented == []
    gate = spec["components"]["schemas"]["GateJob"]["properties"]
    assert gate["repeats"]["default"] == GATE_REPEATS and gate["persona"]["default"] == "llm"
    params = [p for _, _, op in _operations(spec) for p in op.get("parameters", [])]
    assert [p["name"] for p in params if not p.get("description")] == []


def test_a_receipt_is_served_with_its_real_schema(spec):
    ok = spec["paths"]["/receipts/{receipt_id}"]["get"]["responses"]["200"]["content"]
    assert ok["application/json"]["schema"]["$ref"].endswith("/GateReceipt") and "text/html" in ok
    receipt = spec["components"]["schemas"]["GateReceipt"]
    assert {"verdict", "reason", "candidate", "incumbent", "paired", "latency", "checks",
            "scenarios"} <= set(receipt["required"])  # fmt: skip


_URL = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")


def _loads_nothing_from_elsewhere(client: TestClient, page: str) -> None:
    for url in _URL.findall(page):
        assert not re.match(r"^(https?:)?//", url), f"the page loads {url} from another host"
        if url.startswith("/"):
            assert client.get(url).status_code == 200, url


def test_the_docs_pages_are_served_from_this_machine(client, monkeypatch):
    assert client.get("/jobs").status_code == 401  # the API needs the token; its pages do not
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    if docs.swagger_assets() is not None:  # vLLM ships Swagger UI's bundle (the cpu/gpu extras)
        assert "SwaggerUIBundle" in page.text and docs.ASSETS in page.text
        assert client.get(f"{docs.ASSETS}/swagger-ui-bundle.js").status_code == 200
    assert client.get(f"{docs.ASSETS}/secrets.txt").status_code == 404
    _loads_nothing_from_elsewhere(client, page.text)

    reference = client.get("/redoc")  # no package ships ReDoc's bundle: rendered here
    assert reference.status_code == 200 and "<script" not in reference.text
    _loads_nothing_from_elsewhere(client, reference.text)
    for path in ("/jobs", "/jobs/{job_id}/events", "/receipts/{receipt_id}", "/live"):
        assert f'<span class="path">{path}</span>' in reference.text
    assert 'id="schema-GateReceipt"' in reference.text
    assert "Paired runs per scenario" in reference.text  # a field's description
    monkeypatch.setattr(docs, "swagger_assets", lambda: None)  # a service-only install
    assert client.get("/docs").text == reference.text
    assert client.get(f"{docs.ASSETS}/swagger-ui-bundle.js").status_code == 404


# --- the README's curl examples, as written ---------------------------------------------------


def _readme_curls() -> list[list[str]]:
    """Each `curl` command of the README's side-service section, split as a shell splits it."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### The side service") :]
    section = section[: section.index("\n## ")]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        for command in block.replace("\\\n", " ").splitlines():
            command = command.split("  #")[0].strip()
            if command.startswith("curl "):
                commands.append(shlex.split(command))
    return commands


def _request(argv: list[str]) -> tuple[str, str, dict, str | None]:
    """(method, path, headers, body) of a curl command line."""
    method, headers, body, url = None, {}, None, None
    args = iter(argv[1:])
    for arg in args:
        if arg == "-H":
            name, _, value = next(args).partition(":")
            headers[name.strip()] = value.strip()
        elif arg == "-X":
            method = next(args)
        elif arg in ("-d", "--data"):
            body = next(args)
        elif arg == "-N":
            continue
        else:
            assert not arg.startswith("-"), f"the README's curl uses {arg}: teach this test it"
            url = arg
    assert url is not None
    path = "/" + url.split("/", 1)[1]
    return method or ("POST" if body is not None else "GET"), path, headers, body


def test_the_readmes_curl_examples_are_accepted_as_written(tmp_path):
    curls = _readme_curls()
    assert len(curls) >= 2 and any("-d" in c for c in curls)
    # The README serves `--data-dir .` from the repository: the clinic example is there. Its loop
    # stops after the snapshot here, so the queued cycle is over in a second.
    shutil.copytree(ROOT / "examples" / "clinic", tmp_path / "examples" / "clinic",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    loop = tmp_path / "examples" / "clinic" / "loop.yaml"
    loop.write_text(loop.read_text() + "stop_after: snapshot\n")
    job_id = None
    with TestClient(create_app(settings(tmp_path))) as client:
        for argv in curls:
            method, path, headers, body = _request(argv)
            headers = {k: v.replace("$PIPECAT_RL_SERVICE_TOKEN", TOKEN) for k, v in headers.items()}
            if body is not None:
                assert headers.get("Content-Type") == "application/json", argv
            if "<id>" in path:
                assert job_id is not None, "an example reads a job before one was submitted"
                path = path.replace("<id>", job_id)
            r = client.request(method, path, headers=headers, content=body)
            assert r.status_code in (200, 202), (argv, r.status_code, r.text)
            if method == "POST" and path == "/jobs":
                job_id = r.json()["id"]
        assert client.get(f"/jobs/{job_id}", headers=AUTH).json()["state"] == "done"
