package server

import (
	"context"
	"io"
	"net/http"
	"strings"
)

func bufCopy(w *strings.Builder, r *http.Response) (int64, error) { return io.Copy(w, r.Body) }

func ctxT() context.Context { return context.Background() }
