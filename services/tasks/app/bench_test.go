package app_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// BenchmarkREST measures the Agent Protocol routes end to end over loopback
// HTTP, with steps executed by a fakeDispatcher running echoStep over
// loopback gRPC, and every write fsynced.
func BenchmarkREST(b *testing.B) {
	_, conn := startFakeDispatcher(b, echoStep)
	e := startTasks(b, b.TempDir(), conn)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.Run("CreateTask", func(b *testing.B) {
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				var out map[string]any
				if !postDecode(client, e.url+ap, "application/json", strings.NewReader(`{"input":"x"}`), &out) {
					b.Error("create failed")
				}
			}
		})
	})
	b.Run("CreateStep", func(b *testing.B) {
		b.SetParallelism(8)
		var n atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			var task struct {
				TaskID string `json:"task_id"`
			}
			postDecode(client, e.url+ap, "application/json", strings.NewReader(`{}`), &task)
			for pb.Next() {
				var out map[string]any
				body := fmt.Sprintf(`{"input":"step %d"}`, n.Add(1))
				if !postDecode(client, e.url+ap+"/"+task.TaskID+"/steps", "application/json", strings.NewReader(body), &out) || out["status"] != "completed" {
					b.Errorf("step = %v", out)
				}
			}
		})
	})
}
