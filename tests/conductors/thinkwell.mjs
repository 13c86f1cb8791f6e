// The real TypeScript conductor (npm @thinkwell/conductor, pinned in bench/setup_peers.py) as a
// stdio program for the tests: `node tests/conductors/thinkwell.mjs CMD_JSON... AGENT_JSON`, each
// argument a JSON array (argv) of one component, the last one the agent; CONDUCTOR_MODULE names
// the package's dist/index.js. The client is our stdin/stdout (newline-delimited JSON, as the
// conductor's own stdio connector speaks it); the conductor spawns the chain with
// `fromCommands` and routes it (dherman/thinkwell packages/conductor/src/conductor.ts).
import { createInterface } from "node:readline";

const { Conductor, fromCommands } = await import(process.env.CONDUCTOR_MODULE);
const commands = process.argv.slice(2).map((text) => {
  const [command, ...args] = JSON.parse(text);
  return { command, args };
});

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

const conductor = new Conductor({ instantiator: fromCommands(commands), mcpBridgeMode: "disabled" });
await conductor.connect(new StdioClient());
await conductor.shutdown();
await new Promise((resolve) => process.stdout.write("", resolve));
process.exit(0);
