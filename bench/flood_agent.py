"""A fake agent for the fairness bench and tests: answers every request at once (``initialize``
with protocol version 2, anything else with ``{}``), and after a ``stream`` request writes
``agent_message_chunk`` notifications of about 1 KB without end, until its input closes or it
is killed. Stdlib only."""

import json
import sys
import threading

out = sys.stdout.buffer
lock = threading.Lock()
note = (
    b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":'
    b'{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"'
    + b"t" * 1000
    + b'"}}}}\n'
)


def flood() -> None:
    while True:
        with lock:
            out.write(note * 16)
            out.flush()


for raw in sys.stdin.buffer:
    msg = json.loads(raw)
    if msg.get("method") == "stream":
        threading.Thread(target=flood, daemon=True).start()
    if "id" in msg:
        result = {"protocolVersion": 2} if msg["method"] == "initialize" else {}
        with lock:
            line = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode()
            out.write(line + b"\n")
            out.flush()
