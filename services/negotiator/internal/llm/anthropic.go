package llm

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
)

// AnthropicVersion is the anthropic-version header the client sends.
const AnthropicVersion = "2023-06-01"

// Anthropic is a client of Anthropic's Messages API.
//
// Structured output is done with a forced tool: the request declares one
// tool whose input_schema is the wanted schema and sets tool_choice to it,
// and the tool_use input comes back as the response text. We chose this
// over assistant prefill ("{") because the tool input is a parsed object the
// API itself checks against the schema's shape, and prefill leaves the
// model free to wander off after the brace.
type Anthropic struct {
	// BaseURL is the API root, e.g. https://api.anthropic.com; requests go
	// to BaseURL + /v1/messages.
	BaseURL string
	APIKey  string
	HTTP    *http.Client
}

var _ Provider = (*Anthropic)(nil)

type anthropicRequest struct {
	Model      string             `json:"model"`
	System     string             `json:"system,omitempty"`
	Messages   []openAIMessage    `json:"messages"`
	MaxTokens  int                `json:"max_tokens"`
	Tools      []anthropicTool    `json:"tools,omitempty"`
	ToolChoice *anthropicToolPick `json:"tool_choice,omitempty"`
}

type anthropicTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type anthropicToolPick struct {
	Type string `json:"type"`
	Name string `json:"name"`
}

type anthropicResponse struct {
	Model   string `json:"model"`
	Content []struct {
		Type  string          `json:"type"`
		Text  string          `json:"text"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	} `json:"content"`
	Usage struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	} `json:"usage"`
}

// Complete implements Provider.
func (a *Anthropic) Complete(ctx context.Context, model string, req Request) (Response, error) {
	body := anthropicRequest{Model: model, System: req.System, MaxTokens: maxTokens(req)}
	for _, m := range req.Messages {
		body.Messages = append(body.Messages, openAIMessage(m))
	}
	name := schemaName(req)
	if len(req.JSONSchema) > 0 {
		body.Tools = []anthropicTool{{Name: name, Description: "Record the answer as a JSON object matching the schema.", InputSchema: req.JSONSchema}}
		body.ToolChoice = &anthropicToolPick{Type: "tool", Name: name}
	}
	header := http.Header{}
	header.Set("anthropic-version", AnthropicVersion)
	if a.APIKey != "" {
		header.Set("x-api-key", a.APIKey)
	}
	var out anthropicResponse
	if err := postJSON(ctx, a.httpClient(), joinURL(a.BaseURL, "/v1/messages"), header, body, &out, anthropicErrorMessage); err != nil {
		return Response{}, err
	}
	resp := Response{Model: out.Model, PromptTokens: out.Usage.InputTokens, CompletionTokens: out.Usage.OutputTokens}
	var text strings.Builder
	for _, c := range out.Content {
		switch {
		case c.Type == "tool_use" && len(req.JSONSchema) > 0 && c.Name == name:
			resp.Text = string(c.Input)
			return resp, nil
		case c.Type == "text":
			text.WriteString(c.Text)
		}
	}
	if len(req.JSONSchema) > 0 && text.Len() == 0 {
		return Response{}, errors.New("llm response has no tool_use block")
	}
	resp.Text = text.String()
	return resp, nil
}

func (a *Anthropic) httpClient() *http.Client {
	if a.HTTP != nil {
		return a.HTTP
	}
	return http.DefaultClient
}

func anthropicErrorMessage(data []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(data, &e)
	return e.Error.Message
}
