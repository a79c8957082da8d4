package pgstore_test

import (
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parleyhq/parley/platform/pgdb/pgdbtest"
	"github.com/parleyhq/parley/services/dispatcher/internal/mailbox"
	"github.com/parleyhq/parley/services/dispatcher/internal/store"
	"github.com/parleyhq/parley/services/dispatcher/internal/store/pgstore"
)

// BenchmarkAddMessage_onePairTwoReplicas: replies racing on one pair of
// one dialogue through two stores on one schema, each moving the pair's
// state from the one it reads (a protocol's step), 4 × GOMAXPROCS callers.
// The worst case of dialogue contention: every write wants the same
// dialogue. docs/benchmarks.md compares SERIALIZABLE with READ COMMITTED
// under the dialogue's lock.
func BenchmarkAddMessage_onePairTwoReplicas(b *testing.B) {
	url, schema := pgdbtest.Schema(b)
	var rs [2]*pgstore.Store
	for i := range rs {
		s, err := pgstore.Open(b.Context(), url, schema, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		rs[i] = s
	}
	const alice, bob = "clients/c/agents/alice", "clients/c/agents/bob"
	t0 := time.Unix(1_800_000_000, 0).UTC()
	pair := store.Pair{A: alice, B: bob}
	m := store.DialogueMessage{ID: "d-m1", DialogueID: "d", Sender: alice, Type: "new_message", Time: t0}
	w := store.MessageWrite{Message: m, Recipients: []string{bob},
		Pairs: []store.PairState{{Pair: pair, State: json.RawMessage(`0`)}},
		Mail:  mailbox.Message{Sender: alice, Category: mailbox.CategoryMessage, Type: m.Type, Body: []byte(`"hi"`), Time: t0}}
	if _, err := rs[0].CreateDialogue(b.Context(), store.Dialogue{ID: "d", Initiator: alice, Category: "message", CreateTime: t0}, w, mailbox.Bound{}); err != nil {
		b.Fatal(err)
	}
	var callers, replies atomic.Int64
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := rs[callers.Add(1)%2]
		for pb.Next() {
			id := fmt.Sprint("r", replies.Add(1))
			_, err := r.AddMessage(b.Context(), "d-m1", mailbox.Bound{}, func(v store.DialogueView) (store.MessageWrite, error) {
				var n int
				if err := json.Unmarshal(v.PairState(pair), &n); err != nil {
					return store.MessageWrite{}, err
				}
				m := store.DialogueMessage{ID: id, Sender: bob, Type: "message_response", InReplyTo: "d-m1", Time: t0}
				return store.MessageWrite{Message: m, Recipients: []string{alice},
					Pairs: []store.PairState{{Pair: pair, State: json.RawMessage(fmt.Sprint(n + 1))}},
					Mail:  mailbox.Message{Sender: bob, Category: mailbox.CategoryMessage, Type: m.Type, Body: []byte(`"r"`), Time: t0}}, nil
			})
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}
