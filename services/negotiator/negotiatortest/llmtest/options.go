package llmtest

import (
	"time"

	"github.com/parleyhq/parley/services/negotiator/internal/llm"
)

// Options returns o with every limit it leaves zero set to a test value:
// llm.NewClient substitutes no defaults (the negotiator's config owns them).
func Options(o llm.Options) llm.Options {
	if o.Timeout == 0 {
		o.Timeout = 60 * time.Second
	}
	if o.BaseBackoff == 0 {
		o.BaseBackoff = 500 * time.Millisecond
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = 20 * time.Second
	}
	if o.MaxConcurrent == 0 {
		o.MaxConcurrent = 8
	}
	return o
}
