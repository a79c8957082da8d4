package rest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/parleyhq/parley/platform/resource"
)

// heartbeat keeps idle event streams open through proxies.
const heartbeat = 15 * time.Second

// events streams the task's step updates as server-sent events: one
// "event: step" per change (created, running, parked, completed) whose data
// is the step's JSON, flushed at once. The stream ends when the client goes
// away or falls too far behind (reconnect and list steps to catch up).
func (h *Handlers) events(w http.ResponseWriter, r *http.Request) {
	t := h.task(w, r)
	if t == nil {
		return
	}
	ch, err := h.b.Subscribe(r.Context(), t.GetName())
	if err != nil {
		writeStatus(w, err)
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, ": subscribed\n\n")
	if rc.Flush() != nil {
		return
	}
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		select {
		case st, ok := <-ch:
			if !ok {
				return
			}
			data, err := json.Marshal(toStepJSON(st))
			if err != nil {
				return
			}
			fmt.Fprintf(w, "event: step\nid: %s\ndata: %s\n\n", resource.ID(st.GetName()), data)
		case <-tick.C:
			fmt.Fprint(w, ": keep-alive\n\n")
		case <-r.Context().Done():
			return
		case <-h.opts.Stopping:
			return
		}
		if rc.Flush() != nil {
			return
		}
	}
}
