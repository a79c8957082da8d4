package ledger

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Price is a model's price in USD per million tokens, which is also
// micro-USD per token.
type Price struct {
	In, Out float64
}

// CostMicroUSD is the cost of a call, rounded to the nearest micro-USD.
func (p Price) CostMicroUSD(prompt, completion int64) int64 {
	return int64(math.Round(float64(prompt)*p.In + float64(completion)*p.Out))
}

// Prices maps a model name (or name prefix) to its price.
type Prices map[string]Price

// DefaultPrices are the paper's (USD per 1M tokens in/out): GPT-4o 5/15,
// Llama-3-405B 5/10, Gemini 1.5 Pro 3.5/10.5.
func DefaultPrices() Prices {
	return Prices{
		"gpt-4o":         {In: 5, Out: 15},
		"llama-3-405b":   {In: 5, Out: 10},
		"gemini-1.5-pro": {In: 3.5, Out: 10.5},
	}
}

// ParsePrices reads "model=in/out,model=in/out" (USD per 1M tokens) on top
// of base, which it does not change.
func ParsePrices(s string, base Prices) (Prices, error) {
	out := Prices{}
	for k, v := range base {
		out[k] = v
	}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		model, rest, ok := strings.Cut(item, "=")
		in, outp, ok2 := strings.Cut(rest, "/")
		if !ok || !ok2 || strings.TrimSpace(model) == "" {
			return nil, fmt.Errorf("price %q: want model=in/out", item)
		}
		pi, err1 := strconv.ParseFloat(strings.TrimSpace(in), 64)
		po, err2 := strconv.ParseFloat(strings.TrimSpace(outp), 64)
		if err1 != nil || err2 != nil || pi < 0 || po < 0 || math.IsInf(pi, 0) || math.IsInf(po, 0) {
			return nil, fmt.Errorf("price %q: prices must be non-negative numbers", item)
		}
		out[strings.TrimSpace(model)] = Price{In: pi, Out: po}
	}
	return out, nil
}

// Lookup returns the price of model: an exact match, else the longest
// configured name model starts with (gpt-4o-2024-08-06 → gpt-4o).
func (p Prices) Lookup(model string) (Price, bool) {
	if pr, ok := p[model]; ok {
		return pr, true
	}
	names := make([]string, 0, len(p))
	for n := range p {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return len(names[i]) > len(names[j]) })
	for _, n := range names {
		if strings.HasPrefix(model, n) {
			return p[n], true
		}
	}
	return Price{}, false
}
