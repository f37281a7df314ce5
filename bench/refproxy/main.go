// A reference reverse proxy for the publish-proxy bench (bench/proxy.ts): Go's standard
// library httputil.ReverseProxy, kept-alive connections to one target, on 127.0.0.1 at a free
// port it prints. Not part of boxhost: it shows, in the same run, what a lean proxy in a
// compiled language gets on this machine, so the publish proxy's figure can be read against it.
package main

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
)

func main() {
	target, err := url.Parse(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	p := httputil.NewSingleHostReverseProxy(target)
	p.Transport = &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 256}
	// autocannon ends its connections mid-request when its time is up: not worth a line each.
	p.ErrorLog = log.New(io.Discard, "", 0)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().(*net.TCPAddr).Port)
	_ = http.Serve(ln, p)
}
