// nats.js over WebSocket (nats.ws) for tests/client/test_websocket.py: `node ws_runner.mjs <ws-url> <user> <pass>`
// runs one scenario (pub/sub with headers, request/reply between two connections, a denied publish, JetStream)
// and prints one JSON object of what it observed; the test runs it against nats-server and zonebus and
// compares. Keys starting with "_" are details, not compared. Node 20 has no global WebSocket: `ws` is the shim.
import { WebSocket } from "ws";
globalThis.WebSocket = WebSocket;
const { connect, headers, StringCodec, NatsError } = await import("nats.ws");

const sc = StringCodec();
const [url, user, pass] = process.argv.slice(2);

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

async function until(pred, ms = 3000) {
  const end = Date.now() + ms;
  while (!pred() && Date.now() < end) await sleep(5);
  return pred();
}

function kind(err) {
  if (err instanceof NatsError) return err.api_error ? `api/${err.api_error.err_code}` : `nats/${err.code}`;
  return `other/${err?.name ?? typeof err}`;
}

async function main() {
  const out = {};
  const opts = { servers: url, user, pass, reconnect: false, timeout: 5000 };
  const nc = await connect(opts);
  const nc2 = await connect(opts);
  out.info = { headers: nc.info.headers, max_payload: nc.info.max_payload, auth_required: nc.info.auth_required };
  const errors = [];
  (async () => {
    for await (const s of nc.status()) if (s.type === "error") errors.push(String(s.data?.code ?? s.data));
  })();

  // pub/sub across two connections (with workers, maybe on two processes), headers included
  const got = [];
  nc2.subscribe("ws.>", { callback: (_e, m) => got.push([m.subject, sc.decode(m.data), m.headers?.get("X-K") ?? null]) });
  await nc2.flush();
  const h = headers();
  h.set("X-K", "v1");
  nc.publish("ws.a", sc.encode("one"));
  nc.publish("ws.b.c", sc.encode("two"), { headers: h });
  nc.publish("ws.big", sc.encode("x".repeat(20000)));
  await nc.flush();
  await until(() => got.length >= 3);
  out.got = got.map(([s, d, k]) => [s, d.length > 10 ? `${d[0]}*${d.length}` : d, k]);

  // request/reply
  nc2.subscribe("svc.echo", { callback: (_e, m) => m.respond(sc.encode(`re:${sc.decode(m.data)}`)) });
  await nc2.flush();
  out.reply = sc.decode((await nc.request("svc.echo", sc.encode("hi"), { timeout: 3000 })).data);
  out.no_responders = await nc.request("svc.none", sc.encode("x"), { timeout: 2000 }).then(() => "ok", kind);

  // a publish the user's permissions deny: an async error, the connection stays
  nc.publish("denied.x", sc.encode("no"));
  await nc.flush();
  await until(() => errors.length > 0, 2000);
  out.errors = errors;
  out.still_open = !nc.isClosed();

  // JetStream through the WebSocket connection
  const jsm = await nc.jetstreamManager();
  await jsm.streams.delete("WSJS").catch(() => {});
  await jsm.streams.add({ name: "WSJS", subjects: ["wsjs.>"] });
  const js = nc.jetstream();
  const ack = await js.publish("wsjs.a", sc.encode("stored"));
  const stored = await jsm.streams.getMessage("WSJS", { seq: ack.seq });
  out.js = { stream: ack.stream, seq: ack.seq, subject: stored.subject, data: sc.decode(stored.data) };
  await jsm.streams.delete("WSJS");

  await nc2.drain();
  await nc.drain();
  return out;
}

try {
  console.log(JSON.stringify(await main()));
} catch (err) {
  console.log(JSON.stringify({ fatal: kind(err), _detail: String(err?.stack ?? err) }));
}
process.exit(0);
