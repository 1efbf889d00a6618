// Drive `podhost mcp` over stdio with the official TypeScript MCP SDK and report what it saw.
//
//   node mcp_check.mjs PODHOST_BIN WORKSPACE
//
// Prints one JSON object: the tool names and hints, a call to each tool, a path outside the
// workspace refused, and a long command cancelled from the client (its processes killed or not).
// The Rust test asserts on it.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [bin, workspace] = process.argv.slice(2);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const textOf = (r) => r.content.map((c) => c.text ?? "").join("");
const outcome = (r) => ({ is_error: Boolean(r.isError), text: textOf(r) });
const alive = (pid) => {
  try {
    process.kill(pid, 0);
  } catch {
    return false;
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0] !== "Z";
  } catch {
    return false;
  }
};

const transport = new StdioClientTransport({
  command: bin,
  args: ["mcp", "--workspace", workspace],
  env: process.env,
  stderr: "inherit",
});
const client = new Client({ name: "podhost-test", version: "0.0.0" });
await client.connect(transport);
const report = { server: client.getServerVersion().name };

const tools = await client.listTools();
report.tools = tools.tools.map((t) => ({
  name: t.name,
  read_only: t.annotations.readOnlyHint,
  destructive: t.annotations.destructiveHint,
}));

report.calls = {};
for (const [name, args] of [
  ["write", { path: "a.txt", content: "one\ntwo\n" }],
  ["read", { path: "a.txt" }],
  ["edit", { path: "a.txt", old_string: "two", new_string: "2" }],
  ["grep", { pattern: "one" }],
  ["glob", { pattern: "*.txt" }],
  ["bash", { command: "wc -l < a.txt" }],
]) {
  report.calls[name] = outcome(await client.callTool({ name, arguments: args }));
}
report.outside = outcome(
  await client.callTool({ name: "write", arguments: { path: "/etc/podhost-escape", content: "x" } }),
);

const ac = new AbortController();
const t0 = Date.now();
const long = client
  .callTool(
    { name: "bash", arguments: { command: "sleep 300 & echo $! $$ > long.pids; wait" } },
    undefined,
    { signal: ac.signal, timeout: 600000 },
  )
  .then(() => "completed", (e) => `rejected: ${e.code}`);
let pids = "";
while (!pids.endsWith("\n") && Date.now() - t0 < 30000) {
  await sleep(50);
  try {
    pids = readFileSync(join(workspace, "long.pids"), "utf8");
  } catch {}
}
ac.abort("stop");
report.cancelled_call = await long;
const started = pids.split(/\s+/).filter(Boolean).map(Number);
const deadline = Date.now() + 15000;
while (started.some(alive) && Date.now() < deadline) await sleep(50);
report.cancel = { processes: started.length, left_running: started.filter(alive).length };

await client.close();
console.log(JSON.stringify(report));
