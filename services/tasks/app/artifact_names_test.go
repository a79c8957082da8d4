package app_test

import (
	"mime/multipart"
	"net/http"
	"testing"
)

// Artifact names are metadata: each artifact id downloads its own bytes,
// whatever names other artifacts of the task have.
func TestUpload_sameNamesKeepTheirOwnBytes(t *testing.T) {
	_, conn := startFakeDispatcher(t, echoStep)
	e := startTasks(t, t.TempDir(), conn)
	task := e.createTask(t, `{}`)
	url := e.url + ap + "/" + task + "/artifacts"
	put := func(relPath, fileName, content string) string {
		t.Helper()
		return mustOK(t, upload(t, url, func(mw *multipart.Writer) {
			if relPath != "" { // omitted: the task's root
				fieldPart("relative_path", relPath)(mw)
			}
			filePart(fileName, content)(mw)
		}))["artifact_id"].(string)
	}
	type upload struct{ id, content string }
	var ups []upload
	for _, u := range []struct{ relPath, fileName, content string }{
		{"", "a.txt", "first"},
		{"", "a.txt", "second"},
		{"gen", "out.txt", "user's out.txt"},
		// A file named like a directory another artifact's path uses, and
		// the other way round.
		{"sub", "dir", "file called sub/dir"},
		{"sub/dir", "f.txt", "file inside sub/dir"},
		{"x/y", "z", "file inside x/y"},
		{"x", "y", "file called x/y"},
	} {
		ups = append(ups, upload{put(u.relPath, u.fileName, u.content), u.content})
	}
	// The agent creates gen/out.txt too (echoStep "file": "Washington").
	step := mustOK(t, postJSON(t, e.url+ap+"/"+task+"/steps", `{"input":"file"}`))
	arts := step["artifacts"].([]any)
	if len(arts) != 1 {
		t.Fatalf("step artifacts = %v; want one", arts)
	}
	ups = append(ups, upload{arts[0].(map[string]any)["artifact_id"].(string), "Washington"})
	for _, u := range ups {
		d := get(t, url+"/"+u.id)
		if d.code != http.StatusOK || string(d.body) != u.content {
			t.Errorf("download %s = %d %q, want 200 %q", u.id, d.code, d.body, u.content)
		}
	}
	if n := len(mustOK(t, get(t, url+"?page_size=100"))["artifacts"].([]any)); n != len(ups) {
		t.Errorf("listed %d artifacts, want %d", n, len(ups))
	}
}
