package testenv

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is a TCP proxy between a client and a server that injects network
// faults. Point the client at Addr instead of the server.
//
// It is a small own proxy rather than toxiproxy: the five faults below are
// all the tests need, and it keeps a server process and an HTTP API out of
// every test.
type Proxy struct {
	// Addr is the proxy's 127.0.0.1 listen address.
	Addr   string
	target string
	ln     net.Listener

	mu      sync.Mutex
	mode    proxyMode
	delay   time.Duration
	changed chan struct{} // closed and replaced on every mode change
	links   map[*link]struct{}
	closed  bool
	wg      sync.WaitGroup
	reads   atomic.Int64 // reads from clients taken in, see Reads
}

type proxyMode int

const (
	modeOpen proxyMode = iota
	modeCut
	modeBlackhole
	modeDrop
)

type link struct{ client, server net.Conn }

func (l *link) close() { _ = l.client.Close(); _ = l.server.Close() }

// NewProxy starts a proxy on a free 127.0.0.1 port that forwards to target.
// Close stops it.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("testenv: proxy listen: %w", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln,
		changed: make(chan struct{}), links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		mode, closed := p.mode, p.closed
		p.mu.Unlock()
		if closed || mode == modeCut {
			_ = c.Close() // refused: the client sees the connection reset
			continue
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		l := &link{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			l.close()
			continue
		}
		p.links[l] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(l, c, s)
		go p.pipe(l, s, c)
	}
}

type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst. While blackholed it holds the data back (like a
// partition with TCP retransmission: delivered once restored); while
// dropping it discards what it reads; with a delay each chunk is written
// no earlier than its read time plus the delay.
func (p *Proxy) pipe(l *link, src, dst net.Conn) {
	defer p.wg.Done()
	q := make(chan chunk, 64)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for ch := range q {
			if !p.waitOpen() {
				l.close()
				return
			}
			if d := p.currentDelay(); d > 0 {
				if w := time.Until(ch.at.Add(d)); w > 0 {
					time.Sleep(w)
				}
			}
			if _, err := dst.Write(ch.b); err != nil {
				l.close()
				return
			}
		}
	}()
	defer func() {
		close(q)
		<-writerDone
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
		l.close()
	}()
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 {
			// Decided before counting: once Reads has grown, a Restore
			// no longer changes what happens to this read.
			drop := p.dropping()
			if src == l.client {
				p.reads.Add(1)
			}
			if drop {
				continue
			}
			select {
			case q <- chunk{b: buf[:n], at: time.Now()}:
			case <-writerDone:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) dropping() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode == modeDrop
}

// waitOpen blocks while the proxy is blackholed; false when the link must
// close.
func (p *Proxy) waitOpen() bool {
	for {
		p.mu.Lock()
		mode, closed, ch := p.mode, p.closed, p.changed
		p.mu.Unlock()
		if closed || mode == modeCut {
			return false
		}
		if mode == modeOpen || mode == modeDrop {
			return true
		}
		<-ch
	}
}

func (p *Proxy) currentDelay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
}

func (p *Proxy) setMode(m proxyMode) {
	p.mu.Lock()
	p.mode = m
	close(p.changed)
	p.changed = make(chan struct{})
	var cut []*link
	if m == modeCut {
		for l := range p.links {
			cut = append(cut, l)
		}
	}
	p.mu.Unlock()
	for _, l := range cut {
		l.close()
	}
}

// Cut drops every open connection and refuses new ones until Restore.
func (p *Proxy) Cut() { p.setMode(modeCut) }

// Blackhole accepts connections and data but delivers nothing in either
// direction until Restore, as in a network partition.
func (p *Proxy) Blackhole() { p.setMode(modeBlackhole) }

// Drop keeps connections open and accepts new ones but discards the data
// read in either direction until Restore: a request sent meanwhile is
// lost, not late, and its connection waits for an answer that never
// comes, as behind a host gone without a reset.
func (p *Proxy) Drop() { p.setMode(modeDrop) }

// Delay adds d of latency to every chunk in each direction (0 removes it).
func (p *Proxy) Delay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Restore ends Cut, Blackhole (held data is delivered) and Drop, and
// removes any delay.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.delay = 0
	p.mu.Unlock()
	p.setMode(modeOpen)
}

// Reads is how many reads of client data the proxy has taken in so far,
// delivered, held back (blackholed) or discarded (dropping): a test that waits for it to
// grow after a fault began knows that a request met the fault.
func (p *Proxy) Reads() int64 { return p.reads.Load() }

// Close stops the proxy and drops its connections.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.changed)
	p.changed = make(chan struct{})
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
