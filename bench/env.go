package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// placement records where the client and the servers ran: on these 2-core
// machines a loopback round trip costs ~30 µs when client and server share a
// core and ~150 µs across cores, so every figure depends on it.
type placement struct {
	Pinned       bool     `json:"pinned"`
	NumCPU       int      `json:"num_cpu"`
	ClientCPUs   []int    `json:"client_cpus"`
	GOMAXPROCS   int      `json:"gomaxprocs"`
	RedisCPUs    []int    `json:"redis_cpus"`
	PostgresCPUs []int    `json:"postgres_cpus"`
	Proxy        string   `json:"proxy"`
	LoadAvgStart string   `json:"loadavg_start"`
	LoadAvgEnd   string   `json:"loadavg_end,omitempty"`
	CPUModel     string   `json:"cpu_model"`
	GoVersion    string   `json:"go_version"`
	RedisVersion string   `json:"redis_version"`
	PostgresVer  string   `json:"postgres_version"`
	EtcdCPUs     []int    `json:"etcd_cpus,omitempty"`
	EtcdVersion  string   `json:"etcd_version,omitempty"`
	EtcdDataDir  string   `json:"etcd_data_dir,omitempty"`
	Notes        []string `json:"notes,omitempty"`
}

// threadsOf lists the thread ids of a process.
func threadsOf(pid int) []int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return []int{pid}
	}
	var out []int
	for _, e := range ents {
		if t, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, t)
		}
	}
	return out
}

// pinProcess sets the CPU affinity of every thread of pid. Threads and
// children created later inherit it.
func pinProcess(pid int, cpus ...int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	var firstErr error
	for _, tid := range threadsOf(pid) {
		if err := unix.SchedSetaffinity(tid, &set); err != nil && firstErr == nil {
			firstErr = fmt.Errorf("pin pid %d tid %d to %v: %w", pid, tid, cpus, err)
		}
	}
	return firstErr
}

// pinGroup pins every process whose process group is pgid (testenv starts
// each server in its own group, so this catches Postgres' postmaster and the
// auxiliary processes it has already forked; later backends inherit).
func pinGroup(pgid int, cpus ...int) (int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	n := 0
	var firstErr error
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		g, err := unix.Getpgid(pid)
		if err != nil || g != pgid {
			continue
		}
		if err := pinProcess(pid, cpus...); err != nil && firstErr == nil {
			firstErr = err
		}
		n++
	}
	return n, firstErr
}

// affinityOf returns the CPUs pid may run on.
func affinityOf(pid int) []int {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(pid, &set); err != nil {
		return nil
	}
	var out []int
	for c := 0; c < 1024; c++ {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return strings.TrimSpace(string(b))
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "model name") {
			if i := strings.IndexByte(l, ':'); i >= 0 {
				return strings.TrimSpace(l[i+1:])
			}
		}
	}
	return ""
}

// pinClient pins this process (every thread it has now; threads created
// later inherit from their creator) to cpu and runs Go on one P.
func pinClient(cpu int) error {
	runtime.GOMAXPROCS(1)
	return pinProcess(os.Getpid(), cpu)
}

// usage is this process' user+system CPU time, in seconds, and how many
// times its threads gave up or lost their CPU (getrusage: voluntary and
// involuntary context switches): a goroutine that waits for a reply with
// nothing else to run parks its thread, so in a client-bound loop the
// switches count the client's sleeps.
func usage() (cpu, switches float64) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	cpu = float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
	return cpu, float64(ru.Nvcsw + ru.Nivcsw)
}

// cpuTime is user+system CPU time of this process, in seconds.
func cpuTime() float64 {
	cpu, _ := usage()
	return cpu
}
