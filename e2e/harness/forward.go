package main

// The `forward` role joins the machine's loopback to the e2e cluster's private network without an
// interface or a route on the machine. The caller creates the listening socket on 127.0.0.1 in the
// machine's network namespace and starts this role inside the private network namespace with that
// socket inherited: a socket keeps the namespace it was made in, so accepted connections come from
// the machine's loopback while every dial goes out inside the private network.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

func runForward(args []string) int {
	fs := flag.NewFlagSet("forward", flag.ContinueOnError)
	listenFD := fs.Int("listen-fd", -1, "inherited file descriptor of a listening TCP socket (required)")
	to := fs.String("to", "", "host:port to dial for each accepted connection (required)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *listenFD < 3 || *to == "" {
		fmt.Fprintln(os.Stderr, "forward: --listen-fd (>= 3) and --to are required")
		return 2
	}
	f := os.NewFile(uintptr(*listenFD), "listener")
	ln, err := net.FileListener(f)
	_ = f.Close() // FileListener dups the descriptor
	if err != nil {
		fmt.Fprintf(os.Stderr, "forward: fd %d is not a listening socket: %v\n", *listenFD, err)
		return 1
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	go func() {
		<-ctx.Done()
		_ = ln.Close()
	}()
	fmt.Fprintf(os.Stderr, "forward: %s -> %s\n", ln.Addr(), *to)
	var wg sync.WaitGroup
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				wg.Wait()
				return 0
			}
			fmt.Fprintf(os.Stderr, "forward: accept: %v\n", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pipe(ctx, conn, *to)
		}()
	}
}

// pipe copies both ways until either side closes; a half-close is passed on, as a TCP proxy must
// for clients that shut down their sending side and wait for the answer.
func pipe(ctx context.Context, client net.Conn, to string) {
	defer client.Close()
	d := net.Dialer{Timeout: 10 * time.Second}
	upstream, err := d.DialContext(ctx, "tcp", to)
	if err != nil {
		fmt.Fprintf(os.Stderr, "forward: dial %s: %v\n", to, err)
		return
	}
	defer upstream.Close()
	stop := context.AfterFunc(ctx, func() {
		_ = client.Close()
		_ = upstream.Close()
	})
	defer stop()
	done := make(chan struct{}, 2)
	copyHalf := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tcp, ok := dst.(*net.TCPConn); ok {
			_ = tcp.CloseWrite()
		}
		done <- struct{}{}
	}
	go copyHalf(upstream, client)
	go copyHalf(client, upstream)
	<-done
	<-done
}
