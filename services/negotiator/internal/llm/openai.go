package llm

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
)

// StructuredMode says how the OpenAI-compatible client asks for JSON.
type StructuredMode string

// Structured output modes. Servers differ: OpenAI and vLLM honour
// json_schema, older llama.cpp and Ollama builds only json_object.
const (
	StructuredJSONSchema StructuredMode = "json_schema"
	StructuredJSONObject StructuredMode = "json_object"
	StructuredOff        StructuredMode = "off"
)

// OpenAI is a client of an OpenAI-compatible chat-completions endpoint:
// OpenAI, Ollama, vLLM, llama.cpp server, LiteLLM.
type OpenAI struct {
	// BaseURL is the API root, e.g. https://api.openai.com/v1; requests go
	// to BaseURL + /chat/completions.
	BaseURL string
	// APIKey is sent as a bearer token when set.
	APIKey     string
	Structured StructuredMode
	HTTP       *http.Client
}

var _ Provider = (*OpenAI)(nil)

type openAIMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type openAIRequest struct {
	Model          string          `json:"model"`
	Messages       []openAIMessage `json:"messages"`
	MaxTokens      int             `json:"max_tokens,omitempty"`
	Temperature    float64         `json:"temperature"`
	ResponseFormat any             `json:"response_format,omitempty"`
}

type openAIResponse struct {
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	} `json:"usage"`
}

// Complete implements Provider.
func (o *OpenAI) Complete(ctx context.Context, model string, req Request) (Response, error) {
	body := openAIRequest{Model: model, MaxTokens: maxTokens(req)}
	if req.System != "" {
		body.Messages = append(body.Messages, openAIMessage{Role: "system", Content: req.System})
	}
	for _, m := range req.Messages {
		body.Messages = append(body.Messages, openAIMessage(m))
	}
	if len(req.JSONSchema) > 0 {
		switch o.Structured {
		case StructuredJSONObject:
			body.ResponseFormat = map[string]string{"type": "json_object"}
		case StructuredOff:
		default:
			body.ResponseFormat = map[string]any{
				"type":        "json_schema",
				"json_schema": map[string]any{"name": schemaName(req), "schema": req.JSONSchema},
			}
		}
	}
	header := http.Header{}
	if o.APIKey != "" {
		header.Set("Authorization", "Bearer "+o.APIKey)
	}
	var out openAIResponse
	if err := postJSON(ctx, o.httpClient(), joinURL(o.BaseURL, "/chat/completions"), header, body, &out, openAIErrorMessage); err != nil {
		return Response{}, err
	}
	if len(out.Choices) == 0 {
		return Response{}, errors.New("llm response has no choices")
	}
	return Response{
		Text:             out.Choices[0].Message.Content,
		Model:            out.Model,
		PromptTokens:     out.Usage.PromptTokens,
		CompletionTokens: out.Usage.CompletionTokens,
	}, nil
}

func (o *OpenAI) httpClient() *http.Client {
	if o.HTTP != nil {
		return o.HTTP
	}
	return http.DefaultClient
}

func openAIErrorMessage(data []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(data, &e)
	return e.Error.Message
}
