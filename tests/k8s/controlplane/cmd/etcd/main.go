// Command etcd runs a single-member etcd on loopback for the tandem test control plane.
package main

import (
	"flag"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "etcd-data", "data directory")
	clientURL := flag.String("listen-client-urls", "http://127.0.0.1:2379", "client URL (loopback only)")
	peerURL := flag.String("listen-peer-urls", "http://127.0.0.1:2380", "peer URL (loopback only)")
	flag.Parse()

	cu, err := url.Parse(*clientURL)
	if err != nil {
		log.Fatal(err)
	}
	pu, err := url.Parse(*peerURL)
	if err != nil {
		log.Fatal(err)
	}
	if cu.Hostname() != "127.0.0.1" || pu.Hostname() != "127.0.0.1" {
		log.Fatal("etcd: only 127.0.0.1 is allowed")
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	cfg.Name = "default"
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.LogLevel = "warn"
	cfg.UnsafeNoFsync = true // test cluster: speed over durability

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer e.Close()
	<-e.Server.ReadyNotify()
	log.Printf("etcd ready on %s", cu.String())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
	case err := <-e.Err():
		log.Fatal(err)
	}
}
