// The TypeScript conductor (npm @thinkwell/conductor) as a stdio sidecar, for bench/run.py
// (the peers' rows). Contract: `node bench/peer_conductor.mjs [--annotate] AGENT_CMD [ARG...]`
// with CONDUCTOR_MODULE naming the package's dist/index.js (installed by bench/setup_peers.py into
// bench/build/peers). Without --annotate, no proxy components: the conductor alone between the
// client (our stdin and stdout, newline-delimited JSON) and the agent it spawns. With --annotate,
// one in-process component (the conductor's `inProcess` connector, speaking its proxy protocol:
// `_proxy/successor/request` / `_proxy/successor/notification`) that sets the one `_meta` key of
// bench/rules-annotate.yaml on tool_call_update / terminal_update session/update notifications,
// exactly as bench/relay_min.py's inject does. The conductor parses and re-serializes every
// message and renumbers request ids; JSON-RPC batches are not messages to it (dropped). It ends
// when the agent closes its stdout (or the client its stdin); we exit once our stdout is flushed.
import { createInterface } from "node:readline";

const { Conductor, fromCommands, fromConnectors, inProcess, stdio } = await import(
  process.env.CONDUCTOR_MODULE
);
let argv = process.argv.slice(2);
const annotate = argv[0] === "--annotate";
if (annotate) argv = argv.slice(1);
const [command, ...args] = argv;

class StdioClient {
  async connect() {
    const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
    return {
      send(message) {
        process.stdout.write(JSON.stringify(message) + "\n");
      },
      messages: {
        async *[Symbol.asyncIterator]() {
          for await (const line of rl) {
            if (!line.trim()) continue;
            try {
              yield JSON.parse(line);
            } catch {
              // not JSON: dropped, as the conductor's own StdioConnection does
            }
          }
        },
      },
      async close() {
        rl.close();
      },
    };
  }
}

const KINDS = new Set(["tool_call_update", "terminal_update"]);

function annotateUpdate(method, params) {
  // bench/relay_min.py _inject_one: an explicit `_meta: null` (a clear) is left alone
  if (method !== "session/update" || !params || typeof params !== "object") return;
  const update = params.update;
  if (!update || typeof update !== "object" || !KINDS.has(update.sessionUpdate)) return;
  const meta = update._meta;
  if (meta === null && "_meta" in update) return;
  update._meta =
    meta && typeof meta === "object" && !Array.isArray(meta)
      ? { ...meta, "example.dev/route": "edge" }
      : { "example.dev/route": "edge" };
}

// One proxy component: forwards everything through the conductor's proxy protocol and
// annotates the agent's notifications on the way to the client.
function annotator() {
  return inProcess(async (conn) => {
    let next = 1;
    const pending = new Map(); // our request id -> { answer: id to answer, init: bool }
    for await (const msg of conn.messages) {
      if (!("method" in msg)) {
        const p = pending.get(msg.id);
        if (!p) continue;
        pending.delete(msg.id);
        if ("error" in msg) {
          conn.send({ jsonrpc: "2.0", id: p.answer, error: msg.error });
        } else {
          let result = msg.result;
          if (p.init) result = { ...result, _meta: { ...(result?._meta ?? {}), proxy: true } };
          conn.send({ jsonrpc: "2.0", id: p.answer, result });
        }
      } else if (msg.method === "_proxy/successor/notification") {
        const { method, params } = msg.params;
        annotateUpdate(method, params);
        conn.send({ jsonrpc: "2.0", method, params });
      } else if (msg.method === "_proxy/successor/request") {
        const id = next++; // the agent asks the client: the conductor routes it leftwards
        pending.set(id, { answer: msg.id, init: false });
        conn.send({ jsonrpc: "2.0", id, method: msg.params.method, params: msg.params.params });
      } else if ("id" in msg) {
        let params = msg.params;
        const init = msg.method === "initialize";
        if (init && params?._meta) {
          const { proxy: _, ...rest } = params._meta;
          params = { ...params, _meta: rest };
        }
        const id = next++;
        pending.set(id, { answer: msg.id, init });
        conn.send({
          jsonrpc: "2.0",
          id,
          method: "_proxy/successor/request",
          params: { method: msg.method, params },
        });
      } else {
        conn.send({
          jsonrpc: "2.0",
          method: "_proxy/successor/notification",
          params: { method: msg.method, params: msg.params },
        });
      }
    }
  });
}

const instantiator = annotate
  ? fromConnectors(stdio({ command, args }), [annotator()])
  : fromCommands([{ command, args }]);
const conductor = new Conductor({ instantiator });
await conductor.connect(new StdioClient());
await conductor.shutdown();
// process.stdout to a pipe is asynchronous: exit only once what was written has left
await new Promise((resolve) => process.stdout.write("", resolve));
process.exit(0);
