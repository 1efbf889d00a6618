"""Drive `podhost mcp` with the official Python MCP SDK (`mcp` on PyPI) and report what it saw.

    python mcp_check.py stdio PODHOST_BIN WORKSPACE legacy|auto
    python mcp_check.py http  URL TOKEN legacy|auto

legacy: ClientSession + initialize() (the handshake protocol, 2025-11-25).
auto:   mcp.Client(mode="auto"), which speaks 2026-07-28 when the server offers it.

Prints one JSON object on stdout: the tool list, the result of a call to each tool and of the
calls that must be refused, how long three concurrent one-second commands took, and what
happened to a long command cancelled from the client (its processes killed or not). The Rust
test asserts on it; this script asserts nothing but that the protocol worked.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import asynccontextmanager

import anyio
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def text_of(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


def outcome(result) -> dict:
    return {"is_error": bool(result.is_error), "text": text_of(result)}


@asynccontextmanager
async def legacy_session(transport_cm):
    async with transport_cm as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


@asynccontextmanager
async def auto_client(transport_cm):
    async with Client(transport_cm, mode="auto") as client:
        yield client


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; only its parent has not reaped it yet.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def wait_for_file(path: str, timeout: float) -> str:
    with anyio.fail_after(timeout):
        while True:
            try:
                with open(path) as f:
                    text = f.read()
                if text.endswith("\n"):
                    return text
            except FileNotFoundError:
                pass
            await anyio.sleep(0.05)


async def exercise(s, workspace: str) -> dict:
    report: dict = {}
    tools = await s.list_tools()
    report["tools"] = [
        {
            "name": t.name,
            "title": t.title,
            "read_only": t.annotations.read_only_hint,
            "destructive": t.annotations.destructive_hint,
            "idempotent": t.annotations.idempotent_hint,
            "open_world": t.annotations.open_world_hint,
            "required": t.input_schema.get("required", []),
        }
        for t in tools.tools
    ]
    # The tools whose results carry structuredContent, which the SDK validates against it.
    report["output_schemas"] = [t.name for t in tools.tools if t.output_schema is not None]

    calls = [
        ("write", {"path": "notes/hello.txt", "content": "hi there\n"}),
        ("read", {"path": "notes/hello.txt"}),
        ("edit", {"path": "notes/hello.txt", "old_string": "hi", "new_string": "hello"}),
        ("grep", {"pattern": "hello"}),
        ("glob", {"pattern": "**/*.txt"}),
        ("bash", {"command": "cat notes/hello.txt; echo oops >&2; exit 3"}),
    ]
    report["calls"] = {}
    report["structured"] = {}
    for name, args in calls:
        result = await s.call_tool(name, args)
        report["calls"][name] = outcome(result)
        report["structured"][name] = result.structured_content

    refused = {
        "read_outside": ("read", {"path": "/etc/hostname"}),
        "write_outside": ("write", {"path": "../escape.txt", "content": "x"}),
        "bad_field": ("read", {"file_path": "notes/hello.txt"}),
    }
    report["refused"] = {}
    for key, (name, args) in refused.items():
        report["refused"][key] = outcome(await s.call_tool(name, args))
    try:
        await s.call_tool("nope", {})
        report["refused"]["unknown_tool"] = "no error"
    except Exception as e:  # mcp.shared.exceptions.MCPError
        report["refused"]["unknown_tool"] = str(e)

    # Three one-second commands at once.
    t0 = time.monotonic()
    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(s.call_tool, "bash", {"command": "sleep 1"})
    report["concurrent_seconds"] = time.monotonic() - t0

    # A long command, and a background child of it, cancelled from the client.
    pids = os.path.join(workspace, "long.pids")
    command = "sleep 300 & echo $! $$ > long.pids; wait"
    t0 = time.monotonic()
    async with anyio.create_task_group() as tg:
        scope = anyio.CancelScope()

        async def long_call():
            with scope:
                await s.call_tool("bash", {"command": command})

        tg.start_soon(long_call)
        text = await wait_for_file(pids, 30)
        scope.cancel()
    started = [int(p) for p in text.split()]
    deadline = time.monotonic() + 15
    while any(alive(p) for p in started) and time.monotonic() < deadline:
        await anyio.sleep(0.05)
    report["cancel"] = {
        "processes": len(started),
        "left_running": sum(1 for p in started if alive(p)),
        "seconds": round(time.monotonic() - t0),
    }
    return report


async def main() -> None:
    kind, a, b, mode = sys.argv[1:5]
    http = None
    if kind == "stdio":
        workspace = b
        params = StdioServerParameters(
            command=a, args=["mcp", "--workspace", workspace], env=dict(os.environ)
        )
        transport = stdio_client(params)
    else:
        workspace = os.environ["PODHOST_TEST_WORKSPACE"]
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {b}"})
        transport = streamable_http_client(a, http_client=http)
    wrap = legacy_session if mode == "legacy" else auto_client
    report: dict = {}
    if kind == "http":
        bad = create_mcp_http_client(headers={"Authorization": "Bearer wrong"})
        try:
            async with legacy_session(streamable_http_client(a, http_client=bad)):
                pass
            report["wrong_token"] = "accepted"
        except BaseException as e:  # an ExceptionGroup carrying the refusal
            leaf = e
            while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
                leaf = leaf.exceptions[0]
            report["wrong_token"] = f"{type(leaf).__name__}: {leaf}"
        finally:
            await bad.aclose()
    async with wrap(transport) as s:
        report.update(await exercise(s, workspace))
    if http is not None:
        await http.aclose()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    anyio.run(main)
