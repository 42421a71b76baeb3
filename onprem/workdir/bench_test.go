package workdir

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
)

// benchTree writes size bytes of incompressible data in 100 files.
func benchTree(b *testing.B, size int) string {
	root := b.TempDir()
	x := uint64(88172645463325252)
	per := size / 100
	for i := 0; i < 100; i++ {
		buf := make([]byte, per)
		for j := range buf {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			buf[j] = byte(x)
		}
		p := filepath.Join(root, fmt.Sprintf("d%d/f%03d.bin", i%10, i))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, buf, 0o644)
	}
	return root
}

// benchUploadUnpack: pack the tree, PUT it over loopback HTTP to a
// server that stores it under its checked hash (what the broker does),
// GET it back and unpack it (what the agent does).
func benchUploadUnpack(b *testing.B, size int) {
	root := benchTree(b, size)
	store := b.TempDir()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := filepath.Join(store, "a.tar.gz")
		if r.Method == http.MethodPut {
			f, _ := os.Create(p)
			h := sha256.New()
			io.Copy(io.MultiWriter(f, h), r.Body)
			f.Close()
			if "sha256:"+hex.EncodeToString(h.Sum(nil)) != r.URL.Query().Get("hash") {
				http.Error(w, "hash", http.StatusBadRequest)
			}
			return
		}
		http.ServeFile(w, r, p)
	}))
	defer srv.Close()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		a, err := Pack(root, 1<<30)
		if err != nil {
			b.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPut, srv.URL+"/?hash="+a.Hash, bytes.NewReader(a.Data))
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			b.Fatalf("put: %v %v", err, resp)
		}
		resp.Body.Close()
		resp, err = http.Get(srv.URL)
		if err != nil {
			b.Fatal(err)
		}
		dst := filepath.Join(b.TempDir(), "w")
		if err := Unpack(resp.Body, dst, MaxUnpacked); err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		b.StopTimer()
		os.RemoveAll(dst)
		b.StartTimer()
	}
}

func BenchmarkUploadUnpack10MB(b *testing.B)  { benchUploadUnpack(b, 10<<20) }
func BenchmarkUploadUnpack100MB(b *testing.B) { benchUploadUnpack(b, 100<<20) }
