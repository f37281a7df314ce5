// A keep-alive HTTP server for the publish-proxy bench (bench/proxy.ts), built by the bench with
// Debian's Go and copied into a box: busybox httpd closes every connection and forks per
// request, which measures the fork, not the proxy. Answers "ok\n" to every request.
package main

import (
	"net/http"
	"os"
)

func main() {
	addr := ":8088"
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	body := []byte("ok\n")
	_ = http.ListenAndServe(addr, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write(body)
	}))
}
