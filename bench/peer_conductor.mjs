// The TypeScript conductor (npm @thinkwell/conductor) as a stdio sidecar, for bench/run.py
// (issue 13, "peers"). Contract: `node bench/peer_conductor.mjs AGENT_CMD [ARG...]` with
// CONDUCTOR_MODULE naming the package's dist/index.js (installed by bench/setup_peers.py into
// bench/build/peers). No proxy components: the conductor alone between the client (our stdin and
// stdout, newline-delimited JSON) and the agent it spawns. It parses and re-serializes every
// message and renumbers request ids; JSON-RPC batches are not messages to it (dropped).
import { createInterface } from "node:readline";

const { Conductor, fromCommands } = await import(process.env.CONDUCTOR_MODULE);
const [command, ...args] = process.argv.slice(2);

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

const conductor = new Conductor({ instantiator: fromCommands([{ command, args }]) });
await conductor.connect(new StdioClient());
await conductor.shutdown();
process.exit(0);
