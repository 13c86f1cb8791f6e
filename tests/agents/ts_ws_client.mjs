// A client on the official TypeScript SDK's WebSocket transport (npm @agentclientprotocol/sdk,
// `experimental/ws-client`, pinned in bench/setup_peers.py) with the `ws` package's WebSocket
// (Node 20 has no global one), for tests/test_websocket_sdk.py:
// `node tests/agents/ts_ws_client.mjs` connects to ACP_URL with `Authorization: Bearer
// $ACP_TOKEN`, sends each JSON-RPC message of ACP_SEND (a JSON array) and waits for its answer,
// printing every message it receives as one JSON line; a failed connection prints
// {"failed": MESSAGE} and exits 1. ACP_TS_WS_CLIENT_MODULE names the SDK's
// dist/transports/ws-stream.js, ACP_WS_MODULE the ws package's wrapper.mjs.
const { createWebSocketStream } = await import(process.env.ACP_TS_WS_CLIENT_MODULE);
const { WebSocket } = await import(process.env.ACP_WS_MODULE);

const stream = createWebSocketStream(process.env.ACP_URL, {
  WebSocket,
  headers: { Authorization: `Bearer ${process.env.ACP_TOKEN}` },
});
const writer = stream.writable.getWriter();
const reader = stream.readable.getReader();
try {
  for (const message of JSON.parse(process.env.ACP_SEND)) {
    await writer.write(message);
    for (;;) {
      const { value, done } = await reader.read();
      if (done) throw new Error("the stream ended");
      console.log(JSON.stringify(value));
      if (value.id === message.id && !("method" in value)) break;
    }
  }
  await writer.close();
} catch (error) {
  console.log(JSON.stringify({ failed: String(error?.message ?? error) }));
  process.exit(1);
}
process.exit(0);
