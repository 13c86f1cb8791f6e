// A v2 agent on the official TypeScript SDK (npm @agentclientprotocol/sdk, pinned in
// bench/setup_peers.py; its `experimental/v2` entry point), for the turn telemetry tests:
// `node tests/agents/ts_sdk_v2_agent.mjs` speaks ACP v2 on stdin/stdout; ACP_TS_SDK_V2_MODULE
// names the SDK's dist/v2/stable/acp.js.
//
// One scripted prompt turn, in order: `state_update` running, the `user_message` echo, the
// `session/prompt` response (v2: it only acknowledges the inserted user message), a
// `tool_call_update` that creates the tool call (pending), `session/request_permission` with the
// tool call as its subject, `tool_call_update` in_progress then completed (terminal), two
// `agent_message_chunk`s, and `state_update` idle with `stopReason: end_turn`. The updates of
// the turn run after the response is sent, as a real agent's work does.
import { Readable, Writable } from "node:stream";

const acp = await import(process.env.ACP_TS_SDK_V2_MODULE);

const SESSION = "sess_ts_v2_001";
const TOOL = "call_ts_001";
const USER_MESSAGE = "msg_user_ts_1";
const AGENT_MESSAGE = "msg_agent_ts_1";

async function update(client, sessionId, update) {
  await client.notify(acp.methods.client.session.update, { sessionId, update });
}

async function runTurn(client, sessionId) {
  await update(client, sessionId, {
    sessionUpdate: "tool_call_update",
    toolCallId: TOOL,
    title: "Read README.md",
    kind: "read",
    status: "pending",
  });
  const answer = await client.request(acp.methods.client.session.requestPermission, {
    sessionId,
    title: "Read README.md?",
    subject: { type: "tool_call", toolCall: { toolCallId: TOOL } },
    options: [
      { optionId: "yes", name: "Allow once", kind: "allow_once" },
      { optionId: "no", name: "Reject", kind: "reject_once" },
    ],
  });
  const allowed = answer.outcome.outcome === "selected" && answer.outcome.optionId === "yes";
  if (allowed) {
    await update(client, sessionId, {
      sessionUpdate: "tool_call_update",
      toolCallId: TOOL,
      status: "in_progress",
    });
  }
  await update(client, sessionId, {
    sessionUpdate: "tool_call_update",
    toolCallId: TOOL,
    status: allowed ? "completed" : "failed",
  });
  for (const text of ["The README ", "says hello."]) {
    await update(client, sessionId, {
      sessionUpdate: "agent_message_chunk",
      messageId: AGENT_MESSAGE,
      content: { type: "text", text },
    });
  }
  await update(client, sessionId, {
    sessionUpdate: "state_update",
    state: "idle",
    stopReason: "end_turn",
  });
}

const app = acp
  .agent({ name: "ts-sdk-v2-agent" })
  .onRequest(acp.methods.agent.initialize, () => ({
    protocolVersion: acp.PROTOCOL_VERSION,
    info: { name: "ts-sdk-v2-agent", version: "1.0.0" },
    capabilities: {},
  }))
  .onRequest(acp.methods.agent.session.new, () => ({ sessionId: SESSION }))
  .onRequest(acp.methods.agent.session.prompt, async ({ params, client }) => {
    const { sessionId, prompt } = params;
    await update(client, sessionId, { sessionUpdate: "state_update", state: "running" });
    await update(client, sessionId, {
      sessionUpdate: "user_message",
      messageId: USER_MESSAGE,
      content: prompt,
    });
    // The turn goes on after the response; a failure there closes the connection loudly.
    setImmediate(() => {
      runTurn(client, sessionId).catch((error) => {
        console.error(error);
        process.exit(1);
      });
    });
    return { messageId: USER_MESSAGE };
  })
  .onNotification(acp.methods.agent.session.cancel, () => {});

const stream = acp.ndJsonStream(Writable.toWeb(process.stdout), Readable.toWeb(process.stdin));
const connection = app.connect(stream);
await connection.closed;
