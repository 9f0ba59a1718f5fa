// nats.js scenario runner for tests/peers: `node runner.mjs <server-url> <scenario>` prints one JSON object
// with what the scenario observed (messages, error kinds, KV values, stream fields). The same scenario is run
// against nats-server and zonebus and the two outputs must be equal; keys starting with "_" are details that
// are shown on a mismatch but not compared.
import { createHash } from "node:crypto";
import { connect, headers, NatsError, StringCodec, AckPolicy, nanos } from "nats";

const sc = StringCodec();
const [url, scenario] = process.argv.slice(2);
const TAG = "JS"; // names of streams/buckets carry the client language so the Go runner never collides

function kind(err) {
  if (err instanceof NatsError) {
    const api = err.api_error;
    return api ? `api/${api.err_code}` : `nats/${err.code}`;
  }
  return `other/${err?.name ?? typeof err}`;
}

async function attempt(fn) {
  try {
    return { ok: await fn() };
  } catch (err) {
    return { error: kind(err), _detail: String(err?.message ?? err) };
  }
}

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

async function until(pred, ms = 3000) {
  const end = Date.now() + ms;
  while (!pred() && Date.now() < end) await sleep(5);
  return pred();
}

function hdrs(h) {
  if (!h) return null;
  const out = {};
  for (const k of [...h.keys()].sort()) out[k] = h.values(k);
  return out;
}

async function cleanStream(jsm, name) {
  await jsm.streams.delete(name).catch(() => {});
}

// -- core ----------------------------------------------------------------------------------------------

async function wildcards(nc) {
  const patterns = ["pw.*", "pw.>", "pw.*.c", "pw.a.*", "pw.a.>", "pw.*.*.c", "pw.a.b.c"];
  const got = Object.fromEntries(patterns.map((p) => [p, []]));
  for (const p of patterns) nc.subscribe(p, { callback: (_e, m) => got[p].push(m.subject) });
  const subjects = ["pw", "pw.a", "pw.b", "pw.a.b", "pw.a.c", "pw.x.c", "pw.a.b.c", "pw.x.y.c", "pw.a.b.c.d"];
  for (const s of subjects) nc.publish(s, sc.encode(s));
  await nc.flush();
  const invalid = await attempt(async () => {
    nc.publish("pw..bad", sc.encode("x"));
    await nc.flush();
    return "sent";
  });
  return { got, invalid_publish: invalid.error ?? invalid.ok };
}

async function queueGroups(nc) {
  const other = await connect({ servers: url });
  const plain = [];
  const members = [[], [], []];
  const wild = [];
  nc.subscribe("pq.x", { callback: (_e, m) => plain.push(sc.decode(m.data)) });
  nc.subscribe("pq.x", { queue: "g", callback: (_e, m) => members[0].push(sc.decode(m.data)) });
  nc.subscribe("pq.x", { queue: "g", callback: (_e, m) => members[1].push(sc.decode(m.data)) });
  other.subscribe("pq.x", { queue: "g", callback: (_e, m) => members[2].push(sc.decode(m.data)) });
  other.subscribe("pq.*", { queue: "w", callback: (_e, m) => wild.push(sc.decode(m.data)) });
  await nc.flush();
  await other.flush();
  const pub = await connect({ servers: url });
  const n = 60;
  for (let i = 0; i < n; i++) pub.publish("pq.x", sc.encode(String(i)));
  await pub.flush();
  const total = () => members.reduce((a, m) => a + m.length, 0);
  await until(() => plain.length >= n && total() >= n && wild.length >= n);
  await nc.flush();
  await other.flush();
  const group = members.flat();
  const result = {
    plain: plain.length,
    group_total: group.length,
    group_distinct: new Set(group).size,
    group_members_used: members.filter((m) => m.length > 0).length > 1,
    wildcard_group: wild.length,
  };
  await pub.close();
  await other.close();
  return result;
}

async function requestReply(nc) {
  const resp = await connect({ servers: url });
  resp.subscribe("prr.echo", {
    callback: (_e, m) => {
      const h = headers();
      h.set("Echo", m.headers?.get("Ask") ?? "none");
      m.respond(sc.encode(`re:${sc.decode(m.data)}`), { headers: h });
    },
  });
  resp.subscribe("prr.silent", { callback: () => {} });
  await resp.flush();
  const serial = [];
  for (let i = 0; i < 3; i++) {
    const h = headers();
    h.set("Ask", `q${i}`);
    const r = await nc.request("prr.echo", sc.encode(`m${i}`), { timeout: 2000, headers: h });
    serial.push([sc.decode(r.data), r.headers?.get("Echo")]);
  }
  const parallel = await Promise.all(
    [0, 1, 2, 3, 4].map(async (i) => sc.decode((await nc.request("prr.echo", sc.encode(`p${i}`), { timeout: 2000 })).data)),
  );
  const silent = await attempt(() => nc.request("prr.silent", sc.encode("x"), { timeout: 300 }));
  const old = await attempt(async () =>
    sc.decode((await nc.request("prr.echo", sc.encode("old"), { timeout: 2000, noMux: true })).data),
  );
  await resp.close();
  return { serial, parallel, silent: silent.error, no_mux: old.ok };
}

async function noResponders(nc) {
  const none = await attempt(() => nc.request("pnr.none", sc.encode("x"), { timeout: 2000 }));
  const sub = nc.subscribe("pnr.gone");
  await nc.flush();
  sub.unsubscribe();
  await nc.flush();
  const gone = await attempt(() => nc.request("pnr.gone", sc.encode("x"), { timeout: 2000 }));
  const js = nc.jetstream();
  const jsPub = await attempt(() => js.publish("pnr.nostream", sc.encode("x"), { timeout: 2000 }));
  return { none: none.error, after_unsubscribe: gone.error, js_publish: jsPub.error };
}

async function headersScenario(nc) {
  const got = [];
  nc.subscribe("phd.x", { callback: (_e, m) => got.push({ hdrs: hdrs(m.headers), data: sc.decode(m.data) }) });
  const h = headers();
  h.append("Multi", "one");
  h.append("Multi", "two");
  h.set("X-Mixed-Case", "MiXeD value");
  h.set("Empty-Payload", "yes");
  nc.publish("phd.x", sc.encode("with-data"), { headers: h });
  const h2 = headers();
  h2.set("Only", "headers");
  nc.publish("phd.x", new Uint8Array(0), { headers: h2 });
  nc.publish("phd.x", sc.encode("no-headers"));
  await nc.flush();
  return { got, headers_supported: nc.info.headers === true };
}

async function autoUnsubscribe(nc) {
  const got = [];
  const sub = nc.subscribe("pau.x", { max: 3, callback: (_e, m) => got.push(sc.decode(m.data)) });
  const later = [];
  const sub2 = nc.subscribe("pau.y", { callback: (_e, m) => later.push(sc.decode(m.data)) });
  await nc.flush();
  for (let i = 0; i < 6; i++) nc.publish("pau.x", sc.encode(String(i)));
  nc.publish("pau.y", sc.encode("a"));
  await nc.flush();
  sub2.unsubscribe(2); // one already received: one more, then gone
  for (let i = 0; i < 3; i++) nc.publish("pau.y", sc.encode(`b${i}`));
  await nc.flush();
  const other = await connect({ servers: url });
  const fromOther = [];
  other.subscribe("pau.z", { max: 2, callback: (_e, m) => fromOther.push(sc.decode(m.data)) });
  await other.flush();
  for (let i = 0; i < 4; i++) nc.publish("pau.z", sc.encode(String(i)));
  await nc.flush();
  await until(() => fromOther.length >= 2);
  await other.flush();
  await other.close();
  return { got, closed: sub.isClosed(), later, later_closed: sub2.isClosed(), other: fromOther };
}

async function maxPayload(nc) {
  const max = nc.info.max_payload;
  const got = [];
  nc.subscribe("pmp.x", { callback: (_e, m) => got.push(m.data.length) });
  nc.publish("pmp.x", new Uint8Array(max).fill(7));
  await nc.flush();
  const over = await attempt(async () => {
    nc.publish("pmp.x", new Uint8Array(max + 1));
    await nc.flush();
    return "sent";
  });
  const still = await attempt(async () => {
    nc.publish("pmp.x", sc.encode("after"));
    await nc.flush();
    return "ok";
  });
  const jsm = await nc.jetstreamManager();
  const name = `PEER_${TAG}_MAXP`;
  await cleanStream(jsm, name);
  await jsm.streams.add({ name, subjects: ["pmp.js.>"], max_msg_size: 100 });
  const js = nc.jetstream();
  const small = await attempt(async () => (await js.publish("pmp.js.a", new Uint8Array(100))).seq);
  const big = await attempt(() => js.publish("pmp.js.a", new Uint8Array(101)));
  await cleanStream(jsm, name);
  return { max_payload: max, received_sizes: got, over: over.error ?? over.ok, after: still.ok, stream_small: small.ok, stream_big: big.error };
}

async function drain(nc) {
  const slow = [];
  const fast = [];
  const sub = nc.subscribe("pdr.x", {
    callback: (_e, m) => {
      slow.push(sc.decode(m.data));
    },
  });
  nc.subscribe("pdr.x", { callback: (_e, m) => fast.push(sc.decode(m.data)) });
  await nc.flush();
  for (let i = 0; i < 10; i++) nc.publish("pdr.x", sc.encode(String(i)));
  await sub.drain();
  for (let i = 10; i < 15; i++) nc.publish("pdr.x", sc.encode(String(i)));
  await nc.flush();
  const sub3 = [];
  nc.subscribe("pdr.y", {
    callback: (_e, m) => {
      sub3.push(sc.decode(m.data));
    },
  });
  await nc.flush();
  for (let i = 0; i < 20; i++) nc.publish("pdr.y", sc.encode(String(i)));
  const drained = await attempt(async () => {
    await nc.drain();
    return "closed";
  });
  const after = await attempt(async () => {
    nc.publish("pdr.y", sc.encode("late"));
    return "sent";
  });
  return {
    sub_drained: slow.length,
    sub_closed: sub.isClosed(),
    other_sub: fast.length,
    conn_drain: drained.ok ?? drained.error,
    conn_drained_msgs: sub3.length,
    is_closed: nc.isClosed(),
    publish_after: after.error ?? after.ok,
    _closes_itself: true,
  };
}

// -- JetStream -----------------------------------------------------------------------------------------

async function publishDedupe(nc) {
  const jsm = await nc.jetstreamManager();
  const js = nc.jetstream();
  const name = `PEER_${TAG}_DEDUPE`;
  await cleanStream(jsm, name);
  await jsm.streams.add({ name, subjects: ["pdd.>"], duplicate_window: nanos(60_000) });
  const ack = (a) => ({ stream: a.stream === name, seq: a.seq, duplicate: a.duplicate });
  const steps = [];
  steps.push(await attempt(async () => ack(await js.publish("pdd.a", sc.encode("1"), { msgID: "m1" }))));
  steps.push(await attempt(async () => ack(await js.publish("pdd.a", sc.encode("1 again"), { msgID: "m1" }))));
  steps.push(await attempt(async () => ack(await js.publish("pdd.b", sc.encode("2"), { msgID: "m2" }))));
  steps.push(await attempt(async () => ack(await js.publish("pdd.a", sc.encode("x"), { expect: { lastSequence: 5 } }))));
  steps.push(await attempt(async () => ack(await js.publish("pdd.a", sc.encode("3"), { expect: { lastMsgID: "m2" } }))));
  steps.push(await attempt(async () => ack(await js.publish("pdd.a", sc.encode("x"), { expect: { lastMsgID: "zz" } }))));
  steps.push(await attempt(async () => ack(await js.publish("pdd.b", sc.encode("4"), { expect: { lastSubjectSequence: 2 } }))));
  steps.push(await attempt(async () => ack(await js.publish("pdd.b", sc.encode("x"), { expect: { lastSubjectSequence: 2 } }))));
  steps.push(await attempt(async () => ack(await js.publish("pdd.a", sc.encode("x"), { expect: { streamName: "OTHER" } }))));
  const info = await jsm.streams.info(name);
  await cleanStream(jsm, name);
  return { steps, messages: info.state.messages, last_seq: info.state.last_seq };
}

async function multiFilter(nc) {
  const jsm = await nc.jetstreamManager();
  const js = nc.jetstream();
  const name = `PEER_${TAG}_MF`;
  await cleanStream(jsm, name);
  await jsm.streams.add({ name, subjects: ["pmf.>"] });
  for (const [s, d] of [["a", 1], ["b", 1], ["c", 1], ["a", 2], ["b", 2], ["c", 2], ["d.x", 1]]) {
    await js.publish(`pmf.${s}`, sc.encode(String(d)));
  }
  const overlap = await attempt(() =>
    jsm.consumers.add(name, { durable_name: "bad", ack_policy: AckPolicy.Explicit, filter_subjects: ["pmf.a", "pmf.>"] }),
  );
  const ci = await jsm.consumers.add(name, {
    durable_name: "mf",
    ack_policy: AckPolicy.Explicit,
    filter_subjects: ["pmf.a", "pmf.c", "pmf.d.*"],
  });
  const consumer = await js.consumers.get(name, "mf");
  const msgs = [];
  const iter = await consumer.fetch({ max_messages: 5, expires: 3000 });
  for await (const m of iter) {
    msgs.push([m.subject, sc.decode(m.data), m.seq]);
    m.ack();
  }
  await nc.flush();
  const after = await consumer.info();
  await cleanStream(jsm, name);
  return {
    overlap: overlap.error ?? "accepted",
    filter_subjects: ci.config.filter_subjects,
    pending_before: ci.num_pending,
    msgs,
    pending_after: after.num_pending,
    ack_pending_after: after.num_ack_pending,
    delivered: after.delivered.stream_seq,
  };
}

async function orderedConsumer(nc) {
  const jsm = await nc.jetstreamManager();
  const js = nc.jetstream();
  const name = `PEER_${TAG}_ORD`;
  await cleanStream(jsm, name);
  await jsm.streams.add({ name, subjects: ["pord.>"] });
  for (let i = 1; i <= 12; i++) await js.publish(`pord.${i % 3 === 0 ? "b" : "a"}`, sc.encode(String(i)));
  const all = [];
  const c1 = await js.consumers.get(name);
  const it1 = await c1.consume({ max_messages: 5 });
  for await (const m of it1) {
    all.push([m.seq, m.subject, sc.decode(m.data), m.info.pending]);
    if (all.length === 12) break;
  }
  // the server deletes the consumer under a live ordered consume(): the client must notice (409 Consumer
  // Deleted on its pull) and recreate it after the last sequence it saw
  const recreated = [];
  const c1b = await js.consumers.get(name);
  const it1b = await c1b.consume({ max_messages: 5, expires: 1000, idle_heartbeat: 500 });
  const resumed = (async () => {
    for await (const m of it1b) {
      recreated.push([m.seq, sc.decode(m.data)]);
      if (m.seq === 12) {
        const ci = await c1b.info(true);
        await jsm.consumers.delete(name, ci.name);
        await js.publish("pord.a", sc.encode("after-delete"));
      }
      if (m.seq === 13) break;
    }
  })();
  await Promise.race([resumed, sleep(8000)]);
  const filtered = [];
  const c2 = await js.consumers.get(name, { filterSubjects: ["pord.b"], opt_start_seq: 4 });
  const it2 = await c2.fetch({ max_messages: 3, expires: 3000 });
  for await (const m of it2) filtered.push([m.seq, m.subject]);
  const late = [];
  const c3 = await js.consumers.get(name, { deliver_policy: "new" });
  const it3 = await c3.consume();
  const done = (async () => {
    for await (const m of it3) {
      late.push([m.seq, sc.decode(m.data)]);
      if (late.length === 2) break;
    }
  })();
  await sleep(200);
  await js.publish("pord.a", sc.encode("new1"));
  await js.publish("pord.b", sc.encode("new2"));
  await Promise.race([done, sleep(3000)]);
  await cleanStream(jsm, name);
  return { all, recreated: recreated.slice(-2), filtered, late };
}

function pickStreamInfo(si) {
  const c = si.config;
  return {
    config: {
      name: c.name,
      subjects: c.subjects,
      description: c.description,
      retention: c.retention,
      storage: c.storage,
      discard: c.discard,
      max_msgs: c.max_msgs,
      max_bytes: c.max_bytes,
      max_age: c.max_age,
      max_msgs_per_subject: c.max_msgs_per_subject,
      max_msg_size: c.max_msg_size,
      max_consumers: c.max_consumers,
      num_replicas: c.num_replicas,
      duplicate_window: c.duplicate_window,
      allow_direct: c.allow_direct,
      allow_rollup_hdrs: c.allow_rollup_hdrs,
      deny_delete: c.deny_delete,
      deny_purge: c.deny_purge,
      sealed: c.sealed,
    },
    state: {
      messages: si.state.messages,
      bytes: si.state.bytes,
      first_seq: si.state.first_seq,
      last_seq: si.state.last_seq,
      num_subjects: si.state.num_subjects,
      consumer_count: si.state.consumer_count,
      num_deleted: si.state.num_deleted ?? 0,
    },
  };
}

async function streamInfo(nc) {
  const jsm = await nc.jetstreamManager();
  const js = nc.jetstream();
  const name = `PEER_${TAG}_SI`;
  await cleanStream(jsm, name);
  const created = await jsm.streams.add({ name, subjects: ["psi.*"], description: "peer test", max_msgs: 100 });
  for (let i = 0; i < 6; i++) await js.publish(`psi.${i % 2 ? "odd" : "even"}`, sc.encode(`v${i}`));
  await jsm.consumers.add(name, { durable_name: "c1", ack_policy: AckPolicy.Explicit });
  const withSubjects = await jsm.streams.info(name, { subjects_filter: ">" });
  const info = await jsm.streams.info(name);
  const updated = await jsm.streams.update(name, { subjects: ["psi.*", "psi2.>"], max_msgs: 50, description: "changed" });
  const bad = await attempt(() => jsm.streams.update(name, { subjects: ["psi.*"], storage: "memory" }));
  const purged = await jsm.streams.purge(name, { filter: "psi.odd" });
  const delMsg = await jsm.streams.deleteMessage(name, 3);
  const afterPurge = await jsm.streams.info(name);
  const names = [];
  for await (const n of jsm.streams.names("psi2.x")) names.push(n);
  const listed = [];
  for await (const s of jsm.streams.list()) if (s.config.name === name) listed.push(s.state.messages);
  await jsm.streams.delete(name);
  const gone = await attempt(() => jsm.streams.info(name));
  return {
    created: pickStreamInfo(created),
    info: pickStreamInfo(info),
    subjects: withSubjects.state.subjects,
    updated: pickStreamInfo(updated).config,
    bad_update: bad.error ?? "accepted",
    purged: purged.purged,
    deleted_msg: delMsg,
    after_purge: pickStreamInfo(afterPurge).state,
    names_by_subject: names.filter((n) => n.startsWith("PEER_")),
    listed,
    gone: gone.error,
  };
}

function entry(e) {
  return e ? { key: e.key, value: sc.decode(e.value), revision: e.revision, operation: e.operation } : null;
}

async function kv(nc) {
  const jsm = await nc.jetstreamManager();
  const js = nc.jetstream();
  const bucket = `PEER_${TAG}_KV`;
  await cleanStream(jsm, `KV_${bucket}`);
  const b = await js.views.kv(bucket, { history: 5 });
  const steps = {};
  steps.put1 = await b.put("k1", sc.encode("v1"));
  steps.get1 = entry(await b.get("k1"));
  steps.update_ok = await attempt(() => b.update("k1", sc.encode("v2"), 1));
  steps.update_stale = await attempt(() => b.update("k1", sc.encode("v3"), 1));
  steps.create_exists = await attempt(() => b.create("k1", sc.encode("x")));
  steps.create_new = await attempt(() => b.create("k2", sc.encode("w1")));
  steps.put_nested = await b.put("dir.k3", sc.encode("n1"));
  await b.delete("k2");
  steps.get_deleted = entry(await b.get("k2"));
  steps.create_after_delete = await attempt(() => b.create("k2", sc.encode("w2")));
  steps.get_missing = entry(await b.get("nope"));
  steps.get_revision = entry(await b.get("k1", { revision: 1 }));
  const keys = [];
  for await (const k of await b.keys()) keys.push(k);
  steps.keys = keys.sort();
  const hist = [];
  for await (const e of await b.history({ key: "k1" })) hist.push([e.revision, e.operation, sc.decode(e.value)]);
  steps.history_k1 = hist;
  const watched = [];
  const w = await b.watch();
  const watching = (async () => {
    for await (const e of w) {
      watched.push([e.key, e.operation, sc.decode(e.value), e.revision]);
      if (e.key === "k9") break;
    }
  })();
  await sleep(100);
  await b.put("k9", sc.encode("late"));
  await Promise.race([watching, sleep(3000)]);
  w.stop();
  steps.watched = watched.sort((x, y) => x[3] - y[3]);
  await b.purge("k1");
  steps.get_purged = entry(await b.get("k1"));
  const hist2 = [];
  for await (const e of await b.history({ key: "k1" })) hist2.push([e.revision, e.operation]);
  steps.history_after_purge = hist2;
  const st = await b.status();
  steps.status = { bucket: st.bucket, values: st.values, history: st.history, ttl: st.ttl, backingStore: st.backingStore };
  await b.destroy();
  steps.bucket_gone = (await attempt(() => jsm.streams.info(`KV_${bucket}`))).error;
  return steps;
}

function payload(n) {
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i++) out[i] = (i * 31 + 7) % 251;
  return out;
}

function sha(bytes) {
  return createHash("sha256").update(bytes).digest("hex");
}

async function readAll(stream) {
  const chunks = [];
  const reader = stream.getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
  }
  return Buffer.concat(chunks);
}

async function objectStore(nc) {
  const jsm = await nc.jetstreamManager();
  const js = nc.jetstream();
  const bucket = `PEER_${TAG}_OBJ`;
  await cleanStream(jsm, `OBJ_${bucket}`);
  const os = await js.views.os(bucket);
  const big = payload(300 * 1024);
  const pick = (i) => (i ? { name: i.name, size: i.size, chunks: i.chunks, digest: i.digest, deleted: i.deleted, description: i.description ?? "" } : null);
  const out = {};
  out.put_big = pick(await os.putBlob({ name: "big.bin", description: "three chunks" }, big));
  out.put_small = pick(await os.putBlob({ name: "small.txt" }, sc.encode("hello object")));
  out.put_empty = pick(await os.putBlob({ name: "empty" }, new Uint8Array(0)));
  const got = await os.get("big.bin");
  const data = await readAll(got.data);
  out.get_big = { size: data.length, sha_ok: sha(data) === sha(big), error: (await got.error) ? "error" : null };
  out.get_small = sc.decode(await os.getBlob("small.txt"));
  out.info_small = pick(await os.info("small.txt"));
  out.list = (await os.list()).map((i) => i.name).sort();
  out.get_missing = await attempt(async () => (await os.get("missing")) === null);
  await os.delete("small.txt");
  out.info_deleted = pick(await os.info("small.txt"));
  out.list_after = (await os.list()).map((i) => i.name).sort();
  out.replace = pick(await os.putBlob({ name: "big.bin" }, sc.encode("smaller now")));
  out.get_replaced = sc.decode(await os.getBlob("big.bin"));
  const st = await os.status();
  out.status = { bucket: st.bucket, sealed: st.sealed, backingStore: st.backingStore };
  out.seal = await attempt(async () => (await os.seal()).sealed);
  out.put_sealed = await attempt(() => os.putBlob({ name: "x" }, sc.encode("x")));
  await os.destroy();
  return out;
}

const SCENARIOS = {
  wildcards,
  queue_groups: queueGroups,
  request_reply: requestReply,
  no_responders: noResponders,
  headers: headersScenario,
  auto_unsubscribe: autoUnsubscribe,
  max_payload: maxPayload,
  drain,
  publish_dedupe: publishDedupe,
  multi_filter: multiFilter,
  ordered_consumer: orderedConsumer,
  stream_info: streamInfo,
  kv,
  object_store: objectStore,
};

async function main() {
  const fn = SCENARIOS[scenario];
  if (!fn) {
    console.error(`unknown scenario ${scenario}; known: ${Object.keys(SCENARIOS).join(", ")}`);
    process.exit(2);
  }
  const nc = await connect({ servers: url, name: `peer-js-${scenario}` });
  let result;
  try {
    result = await fn(nc);
  } catch (err) {
    result = { fatal: kind(err), _detail: String(err?.stack ?? err) };
  }
  if (!nc.isClosed()) await nc.close();
  process.stdout.write(JSON.stringify(result) + "\n");
  process.exit(0);
}

setTimeout(() => {
  process.stdout.write(JSON.stringify({ fatal: "runner-timeout" }) + "\n");
  process.exit(3);
}, 25_000).unref();
main();
