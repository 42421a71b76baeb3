package server

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/spillway-dev/spillway/broker"
	"github.com/spillway-dev/spillway/broker/bolt"
)

// TestStoreBackupWhileRunning: an operator copies the live store through
// the API; the copy opens as a store and holds the job submitted before.
func TestStoreBackupWhileRunning(t *testing.T) {
	h := newHarness(t)
	j := h.submit(tokAlice, `{"resources": {"gpus": 1}, "command": ["x"]}`)
	if code := h.do("GET", "/v1/store/backup", tokAlice, nil, nil); code != http.StatusForbidden {
		t.Fatalf("user backup: %d", code)
	}
	req, _ := http.NewRequest("GET", h.http.URL+"/v1/store/backup", nil)
	req.Header.Set("Authorization", "Bearer "+tokAdmin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	path := filepath.Join(t.TempDir(), "copy.db")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(f, resp.Body)
	f.Close()
	if err != nil || resp.StatusCode != http.StatusOK || n == 0 || n != resp.ContentLength {
		t.Fatalf("backup: %d, %d of %d bytes, %v", resp.StatusCode, n, resp.ContentLength, err)
	}
	st, err := bolt.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	err = st.View(ctxT(), func(tx broker.Tx) error {
		got, err := broker.GetJob(tx, j.ID)
		if err == nil && got.Spec.Team != "nlp" {
			t.Errorf("copied job: %+v", got)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}
