package llm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/parleyhq/parley/platform/jsondepth"
)

// maxResponseBytes caps a provider's answer; completions are far smaller.
const maxResponseBytes = 8 << 20

// postJSON posts body to url and decodes a 2xx answer into out. Other
// answers become *HTTPError; errMessage extracts the provider's message.
func postJSON(ctx context.Context, hc *http.Client, url string, header http.Header, body, out any, errMessage func([]byte) string) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("encode llm request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("build llm request: %w", err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("llm request: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return fmt.Errorf("read llm response: %w", err)
	}
	if len(data) > maxResponseBytes {
		return fmt.Errorf("llm response exceeds %d bytes", maxResponseBytes)
	}
	if resp.StatusCode/100 != 2 {
		msg := errMessage(data)
		if msg == "" {
			msg = strings.TrimSpace(string(data))
		}
		if len(msg) > 512 {
			msg = msg[:512]
		}
		return &HTTPError{StatusCode: resp.StatusCode, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()), Message: msg}
	}
	if err := jsondepth.Check(data, jsondepth.Max); err != nil {
		return fmt.Errorf("decode llm response: %w", err)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decode llm response: %w", err)
	}
	return nil
}

func joinURL(base, path string) string {
	return strings.TrimRight(base, "/") + path
}
