package routine

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkCall runs a reply routine typical of derived ones: string
// concatenation, a dict built from the query, a tool call and a format,
// through the allocation guards: in this process (no hard boundary, the
// reference) and behind the worker-process boundary, sequentially and
// from 16 goroutines. The routine is an agent's, as an envelope's is (the
// calls of one agent are pipelined on its workers; dry runs are not).
func BenchmarkCall(b *testing.B) {
	b.Run("in-process", func(b *testing.B) { benchCall(b, InProcessForTests(), 1) })
	b.Run("workers", func(b *testing.B) { benchCall(b, newTestPool(b, PoolOptions{Workers: 4}), 1) })
	b.Run("in-process-parallel16", func(b *testing.B) { benchCall(b, InProcessForTests(), 16) })
	b.Run("workers-parallel16", func(b *testing.B) { benchCall(b, newTestPool(b, PoolOptions{Workers: 4}), 16) })
}

func benchCall(b *testing.B, pool *Pool, par int) {
	table, err := TableTool(`{"Paris": {"t": 7}}`)
	if err != nil {
		b.Fatal(err)
	}
	p, err := Compile(b.Context(), "clients/c/agents/a/routines/r", `
def reply(query, memory):
    out = {}
    for k in ["a", "b", "c", "d"]:
        out[k + "_x"] = "v-" + k * 2
    out["w"] = weather(query["city"])
    out["s"] = "%s/%d" % (query["city"], len(out))
    return json.encode(out)
`, map[string]Tool{"weather": table}, testLimits(Limits{Pool: pool}))
	if err != nil {
		b.Fatal(err)
	}
	args := []json.RawMessage{json.RawMessage(`{"city":"Paris"}`)}
	b.ReportAllocs()
	// cpu-ns/op is the CPU the call costs the server and its workers
	// together: at high concurrency on a busy machine throughput follows
	// it, not the latency of one call.
	// switches/op counts the threads' voluntary context switches (each a
	// sleep and a wake-up): a count, so a loaded machine does not move it.
	cpu0, sw0 := cpuTime(pool)
	defer func() {
		cpu, sw := cpuTime(pool)
		b.ReportMetric(float64(cpu-cpu0)/float64(b.N), "cpu-ns/op")
		b.ReportMetric(float64(sw-sw0)/float64(b.N), "switches/op")
	}()
	if par == 1 {
		for b.Loop() {
			if _, _, err := p.Call(b.Context(), "reply", args, json.RawMessage(`{}`)); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	b.SetParallelism(par)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, _, err := p.Call(b.Context(), "reply", args, json.RawMessage(`{}`)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// cpuTime is the CPU time, in ns, this process and the pool's live workers
// have used, and their threads' voluntary context switches: sums over their
// threads' /proc schedstat and status (0 where there is no /proc).
func cpuTime(pool *Pool) (ns, switches int64) {
	pids := append([]int{os.Getpid()}, pool.Stats().Workers...)
	for _, pid := range pids {
		tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*"))
		for _, task := range tasks {
			if b, err := os.ReadFile(filepath.Join(task, "schedstat")); err == nil {
				if v, err := strconv.ParseInt(strings.Fields(string(b))[0], 10, 64); err == nil {
					ns += v
				}
			}
			b, err := os.ReadFile(filepath.Join(task, "status"))
			if err != nil {
				continue
			}
			for line := range strings.Lines(string(b)) {
				if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
					n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					switches += n
				}
			}
		}
	}
	return ns, switches
}
