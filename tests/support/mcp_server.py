"""An MCP server built with the official Python SDK (`mcp` on PyPI), on streamable HTTP.

The fake Tool Gate forwards podhost's calls to it in the pod tests:

    python mcp_server.py        -> prints "listening on http://127.0.0.1:PORT/mcp", then serves

It binds 127.0.0.1 port 0 itself and says which port it got, so tests never race for a port.
Tools: add, slow (cancellable; says so on stderr), fail (raises: an isError result), big_text,
tick (a counter: how many times it ran), whoami (the credential and idempotency key it got).
"""

import json
import socket
import sys

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

server = MCPServer(
    "py-tools",
    instructions="The py-tools server adds numbers and counts ticks. Call tick once per request.",
    version="1.0.0",
)
ticks = 0


@server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
async def slow(seconds: float) -> str:
    """Sleep for a while (cancellable)."""
    print(f"slow({seconds}) started", file=sys.stderr, flush=True)
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        print(f"slow({seconds}) cancelled", file=sys.stderr, flush=True)
        raise
    return f"slept {seconds}"


@server.tool()
def fail(message: str) -> str:
    """Always raises: the SDK turns it into an isError result."""
    raise ValueError(message)


@server.tool()
def big_text(kib: int) -> str:
    """Return `kib` KiB of numbered lines."""
    lines = []
    size = 0
    n = 0
    while size < kib * 1024:
        line = f"line {n:06d} of a long answer\n"
        lines.append(line)
        size += len(line)
        n += 1
    return "".join(lines)[: kib * 1024]


@server.tool()
def tick() -> str:
    """Count: how many times this tool ran on this server."""
    global ticks
    ticks += 1
    print(f"tick {ticks}", file=sys.stderr, flush=True)
    return f"tick {ticks}"


@server.tool()
def whoami(ctx: Context) -> str:
    """Say which credential and idempotency key this call came with."""
    headers = ctx.headers or {}
    meta = ctx.request_context.meta
    key = None
    if meta is not None:
        extra = meta.model_dump() if hasattr(meta, "model_dump") else dict(meta)
        key = extra.get("nylorun/idempotency-key")
    return json.dumps({"authorization": headers.get("authorization"), "idempotencyKey": key})


async def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    # Listening before it says so: a client that connects at once waits in the backlog.
    sock.listen(128)
    port = sock.getsockname()[1]
    app = server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    config = uvicorn.Config(app, log_level="warning")
    print(f"listening on http://127.0.0.1:{port}/mcp", flush=True)
    await uvicorn.Server(config).serve(sockets=[sock])


if __name__ == "__main__":
    anyio.run(main)
