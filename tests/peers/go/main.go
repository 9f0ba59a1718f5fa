// Command peer is the nats.go scenario runner for tests/peers: `peer <server-url> <scenario>` prints one JSON
// object with what the scenario observed (messages, error kinds, KV values, stream fields). The same scenario
// runs against nats-server and zonebus and the two outputs must be equal; keys starting with "_" are details
// shown on a mismatch but not compared.
//
// It is written for nats.go 1.22 (Debian's golang-github-nats-io-go-nats-dev) and builds offline in GOPATH
// mode: GO111MODULE=off GOPATH=/usr/share/gocode go build -o peer .
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

type obj = map[string]any

const tag = "GO" // stream and bucket names carry the client language so the nats.js runner never collides

var url string

func kind(err error) string {
	named := []struct {
		err  error
		name string
	}{
		{nats.ErrNoResponders, "no_responders"}, {nats.ErrTimeout, "timeout"}, {nats.ErrMaxPayload, "max_payload"},
		{nats.ErrConnectionClosed, "closed"}, {nats.ErrConnectionDraining, "draining"},
		{nats.ErrBadSubject, "bad_subject"}, {nats.ErrKeyNotFound, "key_not_found"},
		{nats.ErrKeyDeleted, "key_deleted"}, {nats.ErrObjectNotFound, "object_not_found"},
		{nats.ErrBadSubscription, "bad_subscription"}, {nats.ErrNoStreamResponse, "no_stream_response"},
	}
	for _, n := range named {
		if errors.Is(err, n.err) {
			return n.name
		}
	}
	var api *nats.APIError
	if errors.As(err, &api) {
		return fmt.Sprintf("api/%d", api.ErrorCode)
	}
	return "other/" + err.Error()
}

func attempt(fn func() (any, error)) obj {
	v, err := fn()
	if err != nil {
		return obj{"error": kind(err), "_detail": err.Error()}
	}
	return obj{"ok": v}
}

func until(pred func() bool, d time.Duration) bool {
	end := time.Now().Add(d)
	for !pred() && time.Now().Before(end) {
		time.Sleep(5 * time.Millisecond)
	}
	return pred()
}

// collector gathers what callbacks receive, safe for nats.go's per-subscription goroutines.
type collector struct {
	mu   sync.Mutex
	msgs []string
}

func (c *collector) add(s string) {
	c.mu.Lock()
	c.msgs = append(c.msgs, s)
	c.mu.Unlock()
}

func (c *collector) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string{}, c.msgs...)
}

func (c *collector) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

func connect() *nats.Conn {
	nc, err := nats.Connect(url)
	must(err)
	return nc
}

func jsctx(nc *nats.Conn) nats.JetStreamContext {
	js, err := nc.JetStream(nats.MaxWait(3 * time.Second))
	must(err)
	return js
}

// drainSync returns what a synchronous subscription holds once the connection has flushed.
func drainSync(sub *nats.Subscription) []*nats.Msg {
	var out []*nats.Msg
	for {
		m, err := sub.NextMsg(20 * time.Millisecond)
		if err != nil {
			return out
		}
		out = append(out, m)
	}
}

// -- core ----------------------------------------------------------------------------------------------

func wildcards(nc *nats.Conn) obj {
	patterns := []string{"pw.*", "pw.>", "pw.*.c", "pw.a.*", "pw.a.>", "pw.*.*.c", "pw.a.b.c"}
	subs := map[string]*nats.Subscription{}
	for _, p := range patterns {
		s, err := nc.SubscribeSync(p)
		must(err)
		subs[p] = s
	}
	for _, s := range []string{"pw", "pw.a", "pw.b", "pw.a.b", "pw.a.c", "pw.x.c", "pw.a.b.c", "pw.x.y.c", "pw.a.b.c.d"} {
		must(nc.Publish(s, []byte(s)))
	}
	must(nc.Flush())
	got := obj{}
	for p, s := range subs {
		subjects := []string{}
		for _, m := range drainSync(s) {
			subjects = append(subjects, m.Subject)
		}
		got[p] = subjects
	}
	invalid := attempt(func() (any, error) { return "sent", nc.Publish("pw..bad", []byte("x")) })
	badSub := attempt(func() (any, error) { _, err := nc.SubscribeSync("pw..bad"); return "subscribed", err })
	return obj{"got": got, "invalid_publish": invalid, "invalid_subscribe": badSub}
}

func queueGroups(nc *nats.Conn) obj {
	other := connect()
	defer other.Close()
	plain, wild := &collector{}, &collector{}
	members := []*collector{{}, {}, {}}
	_, err := nc.Subscribe("pq.x", func(m *nats.Msg) { plain.add(string(m.Data)) })
	must(err)
	for i, c := range []*nats.Conn{nc, nc, other} {
		member := members[i]
		_, err = c.QueueSubscribe("pq.x", "g", func(m *nats.Msg) { member.add(string(m.Data)) })
		must(err)
	}
	_, err = other.QueueSubscribe("pq.*", "w", func(m *nats.Msg) { wild.add(string(m.Data)) })
	must(err)
	must(nc.Flush())
	must(other.Flush())
	pub := connect()
	defer pub.Close()
	const n = 60
	for i := 0; i < n; i++ {
		must(pub.Publish("pq.x", []byte(fmt.Sprint(i))))
	}
	must(pub.Flush())
	total := func() int { return members[0].n() + members[1].n() + members[2].n() }
	until(func() bool { return plain.n() >= n && total() >= n && wild.n() >= n }, 3*time.Second)
	must(nc.Flush())
	must(other.Flush())
	distinct := map[string]bool{}
	used := 0
	for _, m := range members {
		if m.n() > 0 {
			used++
		}
		for _, v := range m.list() {
			distinct[v] = true
		}
	}
	return obj{"plain": plain.n(), "group_total": total(), "group_distinct": len(distinct),
		"group_members_used": used > 1, "wildcard_group": wild.n()}
}

func requestReply(nc *nats.Conn) obj {
	resp := connect()
	defer resp.Close()
	_, err := resp.Subscribe("prr.echo", func(m *nats.Msg) {
		out := nats.NewMsg(m.Reply)
		out.Data = []byte("re:" + string(m.Data))
		ask := m.Header.Get("Ask")
		if ask == "" {
			ask = "none"
		}
		out.Header.Set("Echo", ask)
		_ = m.RespondMsg(out)
	})
	must(err)
	_, err = resp.Subscribe("prr.silent", func(m *nats.Msg) {})
	must(err)
	must(resp.Flush())
	serial := [][]string{}
	for i := 0; i < 3; i++ {
		req := nats.NewMsg("prr.echo")
		req.Data = []byte(fmt.Sprintf("m%d", i))
		req.Header.Set("Ask", fmt.Sprintf("q%d", i))
		r, err := nc.RequestMsg(req, 2*time.Second)
		must(err)
		serial = append(serial, []string{string(r.Data), r.Header.Get("Echo")})
	}
	parallel := make([]string, 5)
	var wg sync.WaitGroup
	for i := range parallel {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r, err := nc.Request("prr.echo", []byte(fmt.Sprintf("p%d", i)), 2*time.Second)
			if err != nil {
				parallel[i] = kind(err)
				return
			}
			parallel[i] = string(r.Data)
		}(i)
	}
	wg.Wait()
	silent := attempt(func() (any, error) { return nc.Request("prr.silent", []byte("x"), 300*time.Millisecond) })
	old := attempt(func() (any, error) {
		oc, err := nats.Connect(url, nats.UseOldRequestStyle())
		if err != nil {
			return nil, err
		}
		defer oc.Close()
		r, err := oc.Request("prr.echo", []byte("old"), 2*time.Second)
		if err != nil {
			return nil, err
		}
		return string(r.Data), nil
	})
	return obj{"serial": serial, "parallel": parallel, "silent": silent["error"], "no_mux": old}
}

func noResponders(nc *nats.Conn) obj {
	none := attempt(func() (any, error) { return nc.Request("pnr.none", []byte("x"), 2*time.Second) })
	sub, err := nc.SubscribeSync("pnr.gone")
	must(err)
	must(nc.Flush())
	must(sub.Unsubscribe())
	must(nc.Flush())
	gone := attempt(func() (any, error) { return nc.Request("pnr.gone", []byte("x"), 2*time.Second) })
	js := jsctx(nc)
	jsPub := attempt(func() (any, error) { return js.Publish("pnr.nostream", []byte("x")) })
	return obj{"none": none["error"], "after_unsubscribe": gone["error"], "js_publish": jsPub["error"]}
}

func headersScenario(nc *nats.Conn) obj {
	sub, err := nc.SubscribeSync("phd.x")
	must(err)
	m1 := nats.NewMsg("phd.x")
	m1.Header.Add("Multi", "one")
	m1.Header.Add("Multi", "two")
	m1.Header.Set("X-Mixed-Case", "MiXeD value")
	m1.Header.Set("Empty-Payload", "yes")
	m1.Data = []byte("with-data")
	must(nc.PublishMsg(m1))
	m2 := nats.NewMsg("phd.x")
	m2.Header.Set("Only", "headers")
	must(nc.PublishMsg(m2))
	must(nc.Publish("phd.x", []byte("no-headers")))
	must(nc.Flush())
	got := []obj{}
	for _, m := range drainSync(sub) {
		var h any
		if len(m.Header) > 0 {
			h = map[string][]string(m.Header)
		}
		got = append(got, obj{"hdrs": h, "data": string(m.Data)})
	}
	return obj{"got": got, "headers_supported": nc.HeadersSupported()}
}

func autoUnsubscribe(nc *nats.Conn) obj {
	sub, err := nc.SubscribeSync("pau.x")
	must(err)
	must(sub.AutoUnsubscribe(3))
	sub2, err := nc.SubscribeSync("pau.y")
	must(err)
	must(nc.Flush())
	for i := 0; i < 6; i++ {
		must(nc.Publish("pau.x", []byte(fmt.Sprint(i))))
	}
	must(nc.Publish("pau.y", []byte("a")))
	must(nc.Flush())
	later := []string{}
	first, err := sub2.NextMsg(time.Second)
	must(err)
	later = append(later, string(first.Data))
	must(sub2.AutoUnsubscribe(2)) // one already received: one more, then gone
	for i := 0; i < 3; i++ {
		must(nc.Publish("pau.y", []byte(fmt.Sprintf("b%d", i))))
	}
	must(nc.Flush())
	for _, m := range drainSync(sub2) {
		later = append(later, string(m.Data))
	}
	got := []string{}
	for _, m := range drainSync(sub) {
		got = append(got, string(m.Data))
	}
	other := connect()
	defer other.Close()
	fromOther := &collector{}
	osub, err := other.Subscribe("pau.z", func(m *nats.Msg) { fromOther.add(string(m.Data)) })
	must(err)
	must(osub.AutoUnsubscribe(2))
	must(other.Flush())
	for i := 0; i < 4; i++ {
		must(nc.Publish("pau.z", []byte(fmt.Sprint(i))))
	}
	must(nc.Flush())
	until(func() bool { return fromOther.n() >= 2 }, 3*time.Second)
	must(other.Flush())
	return obj{"got": got, "closed": !sub.IsValid(), "later": later, "later_closed": !sub2.IsValid(),
		"other": fromOther.list()}
}

func maxPayload(nc *nats.Conn) obj {
	max := nc.MaxPayload()
	sub, err := nc.SubscribeSync("pmp.x")
	must(err)
	must(nc.Publish("pmp.x", bytes.Repeat([]byte{7}, int(max))))
	must(nc.Flush())
	over := attempt(func() (any, error) { return "sent", nc.Publish("pmp.x", make([]byte, max+1)) })
	after := attempt(func() (any, error) { return "ok", nc.Publish("pmp.x", []byte("after")) })
	must(nc.Flush())
	sizes := []int{}
	for _, m := range drainSync(sub) {
		sizes = append(sizes, len(m.Data))
	}
	js := jsctx(nc)
	name := "PEER_" + tag + "_MAXP"
	_ = js.DeleteStream(name)
	_, err = js.AddStream(&nats.StreamConfig{Name: name, Subjects: []string{"pmp.js.>"}, MaxMsgSize: 100})
	must(err)
	small := attempt(func() (any, error) {
		a, err := js.Publish("pmp.js.a", make([]byte, 100))
		if err != nil {
			return nil, err
		}
		return a.Sequence, nil
	})
	big := attempt(func() (any, error) { return js.Publish("pmp.js.a", make([]byte, 101)) })
	_ = js.DeleteStream(name)
	return obj{"max_payload": max, "received_sizes": sizes, "over": over, "after": after,
		"stream_small": small, "stream_big": big["error"]}
}

func drain(nc *nats.Conn) obj {
	slow, fast, third := &collector{}, &collector{}, &collector{}
	sub, err := nc.Subscribe("pdr.x", func(m *nats.Msg) { time.Sleep(2 * time.Millisecond); slow.add(string(m.Data)) })
	must(err)
	_, err = nc.Subscribe("pdr.x", func(m *nats.Msg) { fast.add(string(m.Data)) })
	must(err)
	must(nc.Flush())
	for i := 0; i < 10; i++ {
		must(nc.Publish("pdr.x", []byte(fmt.Sprint(i))))
	}
	must(sub.Drain())
	until(func() bool { return !sub.IsValid() }, 3*time.Second)
	for i := 10; i < 15; i++ {
		must(nc.Publish("pdr.x", []byte(fmt.Sprint(i))))
	}
	must(nc.Flush())
	until(func() bool { return fast.n() >= 15 }, 3*time.Second)
	_, err = nc.Subscribe("pdr.y", func(m *nats.Msg) { time.Sleep(time.Millisecond); third.add(string(m.Data)) })
	must(err)
	must(nc.Flush())
	for i := 0; i < 20; i++ {
		must(nc.Publish("pdr.y", []byte(fmt.Sprint(i))))
	}
	closed := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(closed) })
	drained := "closed"
	if err := nc.Drain(); err != nil {
		drained = kind(err)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		drained = "not closed"
	}
	after := attempt(func() (any, error) { return "sent", nc.Publish("pdr.y", []byte("late")) })
	return obj{"sub_drained": slow.n(), "sub_closed": !sub.IsValid(), "other_sub": fast.n(),
		"conn_drain": drained, "conn_drained_msgs": third.n(), "is_closed": nc.IsClosed(),
		"publish_after": after["error"]}
}

// -- JetStream -----------------------------------------------------------------------------------------

func ack(name string, a *nats.PubAck, err error) obj {
	if err != nil {
		return obj{"error": kind(err), "_detail": err.Error()}
	}
	return obj{"ok": obj{"stream": a.Stream == name, "seq": a.Sequence, "duplicate": a.Duplicate}}
}

func publishDedupe(nc *nats.Conn) obj {
	js := jsctx(nc)
	name := "PEER_" + tag + "_DEDUPE"
	_ = js.DeleteStream(name)
	_, err := js.AddStream(&nats.StreamConfig{Name: name, Subjects: []string{"pdd.>"}, Duplicates: time.Minute})
	must(err)
	steps := []obj{}
	step := func(subj, data string, opts ...nats.PubOpt) {
		a, err := js.Publish(subj, []byte(data), opts...)
		steps = append(steps, ack(name, a, err))
	}
	step("pdd.a", "1", nats.MsgId("m1"))
	step("pdd.a", "1 again", nats.MsgId("m1"))
	step("pdd.b", "2", nats.MsgId("m2"))
	step("pdd.a", "x", nats.ExpectLastSequence(5))
	step("pdd.a", "3", nats.ExpectLastMsgId("m2"))
	step("pdd.a", "x", nats.ExpectLastMsgId("zz"))
	step("pdd.b", "4", nats.ExpectLastSequencePerSubject(2))
	step("pdd.b", "x", nats.ExpectLastSequencePerSubject(2))
	step("pdd.a", "x", nats.ExpectStream("OTHER"))
	info, err := js.StreamInfo(name)
	must(err)
	_ = js.DeleteStream(name)
	return obj{"steps": steps, "messages": info.State.Msgs, "last_seq": info.State.LastSeq}
}

// api sends a raw JetStream API request: nats.go 1.22 predates filter_subjects, so the multi-filter
// consumer is created and read through the API with the same connection.
func api(nc *nats.Conn, subject string, body any) obj {
	var data []byte // nats-server wants an empty payload where a request has no body (10038 otherwise)
	if body != nil {
		var err error
		data, err = json.Marshal(body)
		must(err)
	}
	r, err := nc.Request("$JS.API."+subject, data, 3*time.Second)
	must(err)
	var out obj
	must(json.Unmarshal(r.Data, &out))
	return out
}

func apiErr(doc obj) any {
	if e, ok := doc["error"].(obj); ok {
		return fmt.Sprintf("api/%v", e["err_code"])
	}
	return nil
}

func multiFilter(nc *nats.Conn) obj {
	js := jsctx(nc)
	name := "PEER_" + tag + "_MF"
	_ = js.DeleteStream(name)
	_, err := js.AddStream(&nats.StreamConfig{Name: name, Subjects: []string{"pmf.>"}})
	must(err)
	for _, p := range [][2]string{{"a", "1"}, {"b", "1"}, {"c", "1"}, {"a", "2"}, {"b", "2"}, {"c", "2"}, {"d.x", "1"}} {
		_, err := js.Publish("pmf."+p[0], []byte(p[1]))
		must(err)
	}
	overlap := api(nc, "CONSUMER.CREATE."+name+".bad", obj{"stream_name": name, "config": obj{
		"durable_name": "bad", "ack_policy": "explicit", "filter_subjects": []string{"pmf.a", "pmf.>"}}})
	created := api(nc, "CONSUMER.CREATE."+name+".mf", obj{"stream_name": name, "config": obj{
		"durable_name": "mf", "ack_policy": "explicit", "filter_subjects": []string{"pmf.a", "pmf.c", "pmf.d.*"}}})
	if e := apiErr(created); e != nil {
		return obj{"fatal": e, "_detail": created}
	}
	sub, err := js.PullSubscribe("", "mf", nats.Bind(name, "mf"))
	msgs := [][]any{}
	bind := "ok"
	if err != nil {
		bind = kind(err)
	} else {
		batch, err := sub.Fetch(5, nats.MaxWait(3*time.Second))
		if err != nil {
			bind = kind(err)
		}
		for _, m := range batch {
			meta, err := m.Metadata()
			must(err)
			msgs = append(msgs, []any{m.Subject, string(m.Data), meta.Sequence.Stream})
			must(m.AckSync())
		}
	}
	info := api(nc, "CONSUMER.INFO."+name+".mf", nil)
	_ = js.DeleteStream(name)
	cfg := created["config"].(obj)
	delivered := info["delivered"].(obj)
	return obj{"overlap": apiErr(overlap), "filter_subjects": cfg["filter_subjects"],
		"pending_before": created["num_pending"], "bind_fetch": bind, "msgs": msgs,
		"pending_after": info["num_pending"], "ack_pending_after": info["num_ack_pending"],
		"delivered": delivered["stream_seq"]}
}

func orderedConsumer(nc *nats.Conn) obj {
	js := jsctx(nc)
	name := "PEER_" + tag + "_ORD"
	_ = js.DeleteStream(name)
	_, err := js.AddStream(&nats.StreamConfig{Name: name, Subjects: []string{"pord.>"}})
	must(err)
	for i := 1; i <= 12; i++ {
		s := "pord.a"
		if i%3 == 0 {
			s = "pord.b"
		}
		_, err := js.Publish(s, []byte(fmt.Sprint(i)))
		must(err)
	}
	read := func(sub *nats.Subscription, n int, withPending bool) [][]any {
		out := [][]any{}
		for len(out) < n {
			m, err := sub.NextMsg(3 * time.Second)
			if err != nil {
				out = append(out, []any{kind(err)})
				break
			}
			meta, err := m.Metadata()
			must(err)
			rec := []any{meta.Sequence.Stream, m.Subject, string(m.Data)}
			if withPending {
				rec = append(rec, meta.NumPending)
			}
			out = append(out, rec)
		}
		return out
	}
	sub1, err := js.SubscribeSync("pord.>", nats.OrderedConsumer(), nats.BindStream(name),
		nats.IdleHeartbeat(300*time.Millisecond))
	must(err)
	all := read(sub1, 12, true)
	// the server deletes the consumer under the live subscription: with no heartbeats coming the client
	// must recreate it after the last sequence it saw
	ci, err := sub1.ConsumerInfo()
	must(err)
	must(js.DeleteConsumer(name, ci.Name))
	_, err = js.Publish("pord.a", []byte("after-delete"))
	must(err)
	recreated := read(sub1, 1, false)
	// nats.go 1.22 may still hold the deleted consumer's name here (its re-create reply can come after the
	// first message), and then Unsubscribe's own delete says "consumer not found" on either server
	_ = sub1.Unsubscribe()
	sub2, err := js.SubscribeSync("pord.b", nats.OrderedConsumer(), nats.BindStream(name), nats.StartSequence(4))
	must(err)
	filtered := read(sub2, 3, false)
	must(sub2.Unsubscribe())
	sub3, err := js.SubscribeSync("pord.>", nats.OrderedConsumer(), nats.BindStream(name), nats.DeliverNew())
	must(err)
	_, err = js.Publish("pord.a", []byte("new1"))
	must(err)
	_, err = js.Publish("pord.b", []byte("new2"))
	must(err)
	late := read(sub3, 2, false)
	must(sub3.Unsubscribe())
	_ = js.DeleteStream(name)
	return obj{"all": all, "recreated": recreated, "filtered": filtered, "late": late}
}

func pickStreamInfo(si *nats.StreamInfo) obj {
	c := si.Config
	return obj{
		"config": obj{"name": c.Name, "subjects": c.Subjects, "description": c.Description,
			"retention": c.Retention.String(), "storage": c.Storage.String(), "discard": c.Discard.String(),
			"max_msgs": c.MaxMsgs, "max_bytes": c.MaxBytes, "max_age": c.MaxAge, "max_msgs_per_subject": c.MaxMsgsPerSubject,
			"max_msg_size": c.MaxMsgSize, "max_consumers": c.MaxConsumers, "num_replicas": c.Replicas,
			"duplicate_window": c.Duplicates, "allow_direct": c.AllowDirect, "allow_rollup_hdrs": c.AllowRollup,
			"deny_delete": c.DenyDelete, "deny_purge": c.DenyPurge, "sealed": c.Sealed},
		"state": pickState(si.State),
	}
}

func pickState(s nats.StreamState) obj {
	return obj{"messages": s.Msgs, "bytes": s.Bytes, "first_seq": s.FirstSeq, "last_seq": s.LastSeq,
		"num_subjects": s.NumSubjects, "consumer_count": s.Consumers, "num_deleted": s.NumDeleted}
}

func streamInfo(nc *nats.Conn) obj {
	js := jsctx(nc)
	name := "PEER_" + tag + "_SI"
	_ = js.DeleteStream(name)
	created, err := js.AddStream(&nats.StreamConfig{Name: name, Subjects: []string{"psi.*"}, Description: "peer test", MaxMsgs: 100})
	must(err)
	for i := 0; i < 6; i++ {
		s := "psi.even"
		if i%2 == 1 {
			s = "psi.odd"
		}
		_, err := js.Publish(s, []byte(fmt.Sprintf("v%d", i)))
		must(err)
	}
	_, err = js.AddConsumer(name, &nats.ConsumerConfig{Durable: "c1", AckPolicy: nats.AckExplicitPolicy})
	must(err)
	withSubjects, err := js.StreamInfo(name, &nats.StreamInfoRequest{SubjectsFilter: ">"})
	must(err)
	info, err := js.StreamInfo(name)
	must(err)
	updated, err := js.UpdateStream(&nats.StreamConfig{Name: name, Subjects: []string{"psi.*", "psi2.>"}, MaxMsgs: 50, Description: "changed"})
	must(err)
	bad := attempt(func() (any, error) {
		return js.UpdateStream(&nats.StreamConfig{Name: name, Subjects: []string{"psi.*"}, Storage: nats.MemoryStorage})
	})
	purge := attempt(func() (any, error) { return "ok", js.PurgeStream(name, &nats.StreamPurgeRequest{Subject: "psi.odd"}) })
	delMsg := attempt(func() (any, error) { return "ok", js.DeleteMsg(name, 3) })
	afterPurge, err := js.StreamInfo(name)
	must(err)
	names := []string{}
	for n := range js.StreamNames(nats.StreamListFilter("psi2.x")) {
		if strings.HasPrefix(n, "PEER_") {
			names = append(names, n)
		}
	}
	listed := []uint64{}
	for s := range js.Streams() {
		if s.Config.Name == name {
			listed = append(listed, s.State.Msgs)
		}
	}
	must(js.DeleteStream(name))
	gone := attempt(func() (any, error) { return js.StreamInfo(name) })
	return obj{"created": pickStreamInfo(created), "info": pickStreamInfo(info), "subjects": withSubjects.State.Subjects,
		"updated": pickStreamInfo(updated)["config"], "bad_update": bad["error"], "purge": purge, "deleted_msg": delMsg,
		"after_purge": pickState(afterPurge.State), "names_by_subject": names, "listed": listed, "gone": gone["error"]}
}

func entry(e nats.KeyValueEntry, err error) any {
	if err != nil {
		return obj{"error": kind(err)}
	}
	return obj{"key": e.Key(), "value": string(e.Value()), "revision": e.Revision(), "operation": e.Operation().String()}
}

func kv(nc *nats.Conn) obj {
	js := jsctx(nc)
	bucket := "PEER_" + tag + "_KV"
	_ = js.DeleteKeyValue(bucket)
	b, err := js.CreateKeyValue(&nats.KeyValueConfig{Bucket: bucket, History: 5})
	must(err)
	rev := func(r uint64, err error) obj {
		if err != nil {
			return obj{"error": kind(err), "_detail": err.Error()}
		}
		return obj{"ok": r}
	}
	out := obj{}
	out["put1"] = rev(b.Put("k1", []byte("v1")))
	out["get1"] = entry(b.Get("k1"))
	out["update_ok"] = rev(b.Update("k1", []byte("v2"), 1))
	out["update_stale"] = rev(b.Update("k1", []byte("v3"), 1))
	out["create_exists"] = rev(b.Create("k1", []byte("x")))
	out["create_new"] = rev(b.Create("k2", []byte("w1")))
	out["put_nested"] = rev(b.Put("dir.k3", []byte("n1")))
	must(b.Delete("k2"))
	out["get_deleted"] = entry(b.Get("k2"))
	out["create_after_delete"] = rev(b.Create("k2", []byte("w2")))
	out["get_missing"] = entry(b.Get("nope"))
	out["get_revision"] = entry(b.GetRevision("k1", 1))
	keys, err := b.Keys()
	must(err)
	sort.Strings(keys)
	out["keys"] = keys
	hist, err := b.History("k1")
	must(err)
	h := [][]any{}
	for _, e := range hist {
		h = append(h, []any{e.Revision(), e.Operation().String(), string(e.Value())})
	}
	out["history_k1"] = h
	w, err := b.WatchAll()
	must(err)
	watched := [][]any{}
	initialDone := false
	timeout := time.After(3 * time.Second)
loop:
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				initialDone = true
				_, err := b.Put("k9", []byte("late"))
				must(err)
				continue
			}
			watched = append(watched, []any{e.Key(), e.Operation().String(), string(e.Value()), e.Revision()})
			if e.Key() == "k9" {
				break loop
			}
		case <-timeout:
			watched = append(watched, []any{"timeout", initialDone})
			break loop
		}
	}
	must(w.Stop())
	out["watched"] = watched
	must(b.Purge("k1"))
	out["get_purged"] = entry(b.Get("k1"))
	hist2 := [][]any{}
	if hs, err := b.History("k1"); err == nil {
		for _, e := range hs {
			hist2 = append(hist2, []any{e.Revision(), e.Operation().String()})
		}
	} else {
		hist2 = append(hist2, []any{kind(err)})
	}
	out["history_after_purge"] = hist2
	st, err := b.Status()
	must(err)
	out["status"] = obj{"bucket": st.Bucket(), "values": st.Values(), "history": st.History(), "ttl": st.TTL(),
		"backingStore": st.BackingStore()}
	must(js.DeleteKeyValue(bucket))
	out["bucket_gone"] = attempt(func() (any, error) { return js.KeyValue(bucket) })["error"]
	return out
}

func payload(n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = byte((i*31 + 7) % 251)
	}
	return out
}

func pickObject(i *nats.ObjectInfo, err error) any {
	if err != nil {
		return obj{"error": kind(err), "_detail": err.Error()}
	}
	return obj{"name": i.Name, "size": i.Size, "chunks": i.Chunks, "digest": i.Digest, "deleted": i.Deleted,
		"description": i.Description}
}

func objectStore(nc *nats.Conn) obj {
	js := jsctx(nc)
	bucket := "PEER_" + tag + "_OBJ"
	_ = js.DeleteObjectStore(bucket)
	os, err := js.CreateObjectStore(&nats.ObjectStoreConfig{Bucket: bucket})
	must(err)
	big := payload(300 * 1024)
	out := obj{}
	out["put_big"] = pickObject(os.Put(&nats.ObjectMeta{Name: "big.bin", Description: "three chunks"}, bytes.NewReader(big)))
	out["put_small"] = pickObject(os.PutString("small.txt", "hello object"))
	out["put_empty"] = pickObject(os.PutBytes("empty", []byte{}))
	data, err := os.GetBytes("big.bin")
	if err != nil {
		out["get_big"] = obj{"error": kind(err)}
	} else {
		out["get_big"] = obj{"size": len(data), "sha_ok": sha256.Sum256(data) == sha256.Sum256(big)}
	}
	out["get_small"] = attempt(func() (any, error) { return os.GetString("small.txt") })
	out["info_small"] = pickObject(os.GetInfo("small.txt"))
	list := func() []string {
		infos, err := os.List()
		names := []string{}
		if err != nil {
			return append(names, kind(err))
		}
		for _, i := range infos {
			names = append(names, i.Name)
		}
		sort.Strings(names)
		return names
	}
	out["list"] = list()
	out["get_missing"] = attempt(func() (any, error) { return os.GetBytes("missing") })["error"]
	must(os.Delete("small.txt"))
	out["info_deleted"] = pickObject(os.GetInfo("small.txt", nats.GetObjectInfoShowDeleted()))
	out["info_deleted_hidden"] = pickObject(os.GetInfo("small.txt"))
	out["list_after"] = list()
	out["replace"] = pickObject(os.PutString("big.bin", "smaller now"))
	out["get_replaced"] = attempt(func() (any, error) { return os.GetString("big.bin") })
	st, err := os.Status()
	must(err)
	out["status"] = obj{"bucket": st.Bucket(), "sealed": st.Sealed(), "backingStore": st.BackingStore()}
	out["seal"] = attempt(func() (any, error) {
		if err := os.Seal(); err != nil {
			return nil, err
		}
		st, err := os.Status()
		if err != nil {
			return nil, err
		}
		return st.Sealed(), nil
	})
	out["put_sealed"] = attempt(func() (any, error) { return os.PutString("x", "x") })["error"]
	_ = js.DeleteObjectStore(bucket)
	return out
}

var scenarios = map[string]func(*nats.Conn) obj{
	"wildcards": wildcards, "queue_groups": queueGroups, "request_reply": requestReply,
	"no_responders": noResponders, "headers": headersScenario, "auto_unsubscribe": autoUnsubscribe,
	"max_payload": maxPayload, "drain": drain, "publish_dedupe": publishDedupe, "multi_filter": multiFilter,
	"ordered_consumer": orderedConsumer, "stream_info": streamInfo, "kv": kv, "object_store": objectStore,
}

func run(fn func(*nats.Conn) obj, nc *nats.Conn) (result obj) {
	defer func() {
		if r := recover(); r != nil {
			err, ok := r.(error)
			if ok {
				result = obj{"fatal": kind(err), "_detail": err.Error()}
			} else {
				result = obj{"fatal": "panic", "_detail": fmt.Sprint(r)}
			}
		}
	}()
	return fn(nc)
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: peer <server-url> <scenario>")
		os.Exit(2)
	}
	url = os.Args[1]
	fn, ok := scenarios[os.Args[2]]
	if !ok {
		names := []string{}
		for n := range scenarios {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "unknown scenario %s; known: %s\n", os.Args[2], strings.Join(names, ", "))
		os.Exit(2)
	}
	go func() {
		time.Sleep(25 * time.Second)
		fmt.Println(`{"fatal":"runner-timeout"}`)
		os.Exit(3)
	}()
	nc, err := nats.Connect(url, nats.Name("peer-go-"+os.Args[2]))
	if err != nil {
		fmt.Fprintln(os.Stderr, "connect:", err)
		os.Exit(1)
	}
	result := run(fn, nc)
	nc.Close()
	out, err := json.Marshal(result)
	must(err)
	fmt.Println(string(out))
}
