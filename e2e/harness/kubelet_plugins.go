package main

// Plugin registration as kubelet's plugin watcher does it, and the DRA gRPC clients of one
// registered plugin instance (k8s.io/kubelet's generated clients, v1 or v1beta1).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// draPlugin is one registered plugin instance. Only one service version is used per instance: the
// first one in the plugin's own list that this kubelet knows, as the real kubelet chooses.
type draPlugin struct {
	driver   string
	endpoint string
	service  string
	conn     *grpc.ClientConn
	regPath  string
	regMtime time.Time
}

func (p *draPlugin) prepare(ctx context.Context, claims []*drav1.Claim) (map[string]*drav1.NodePrepareResourceResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if p.service == drav1.DRAPluginService {
		resp, err := drav1.NewDRAPluginClient(p.conn).NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: claims})
		if err != nil {
			return nil, err
		}
		return resp.GetClaims(), nil
	}
	old := make([]*drav1beta1.Claim, 0, len(claims))
	for _, c := range claims {
		old = append(old, &drav1beta1.Claim{Namespace: c.Namespace, Uid: c.Uid, Name: c.Name})
	}
	resp, err := drav1beta1.NewDRAPluginClient(p.conn).NodePrepareResources(ctx, &drav1beta1.NodePrepareResourcesRequest{Claims: old})
	if err != nil {
		return nil, err
	}
	out := map[string]*drav1.NodePrepareResourceResponse{}
	for uid, r := range resp.GetClaims() {
		conv := &drav1.NodePrepareResourceResponse{Error: r.GetError()}
		for _, d := range r.GetDevices() {
			conv.Devices = append(conv.Devices, &drav1.Device{RequestNames: d.GetRequestNames(), PoolName: d.GetPoolName(), DeviceName: d.GetDeviceName(), CdiDeviceIds: d.GetCdiDeviceIds()})
		}
		out[uid] = conv
	}
	return out, nil
}

func (p *draPlugin) unprepare(ctx context.Context, claims []*drav1.Claim) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	out := map[string]string{}
	if p.service == drav1.DRAPluginService {
		resp, err := drav1.NewDRAPluginClient(p.conn).NodeUnprepareResources(ctx, &drav1.NodeUnprepareResourcesRequest{Claims: claims})
		if err != nil {
			return nil, err
		}
		for uid, r := range resp.GetClaims() {
			out[uid] = r.GetError()
		}
		return out, nil
	}
	old := make([]*drav1beta1.Claim, 0, len(claims))
	for _, c := range claims {
		old = append(old, &drav1beta1.Claim{Namespace: c.Namespace, Uid: c.Uid, Name: c.Name})
	}
	resp, err := drav1beta1.NewDRAPluginClient(p.conn).NodeUnprepareResources(ctx, &drav1beta1.NodeUnprepareResourcesRequest{Claims: old})
	if err != nil {
		return nil, err
	}
	for uid, r := range resp.GetClaims() {
		out[uid] = r.GetError()
	}
	return out, nil
}

// scanRegistry is kubelet's plugin watcher: sockets that appear (or are re-created) under the
// registry dir get registered, sockets that vanish get deregistered.
func (k *kubelet) scanRegistry(ctx context.Context) {
	seen := map[string]os.FileInfo{}
	_ = filepath.WalkDir(k.registryDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(d.Name(), ".") || d.Type()&os.ModeSocket == 0 {
			return nil
		}
		if info, err := d.Info(); err == nil {
			seen[path] = info
		}
		return nil
	})
	k.mu.Lock()
	var gone []*draPlugin
	for driver, p := range k.plugins {
		info, ok := seen[p.regPath]
		if !ok || !info.ModTime().Equal(p.regMtime) {
			gone = append(gone, p)
			delete(k.plugins, driver)
		}
	}
	known := map[string]bool{}
	for _, p := range k.plugins {
		known[p.regPath] = true
	}
	for path, mtime := range k.rejected {
		if info, ok := seen[path]; ok && info.ModTime().Equal(mtime) {
			known[path] = true
		} else {
			delete(k.rejected, path)
		}
	}
	k.mu.Unlock()
	for _, p := range gone {
		_ = p.conn.Close()
		k.rec.record(event{Event: "deregistered", Driver: p.driver, Endpoint: p.endpoint})
	}
	paths := make([]string, 0, len(seen))
	for path := range seen {
		if !known[path] {
			paths = append(paths, path)
		}
	}
	sort.Strings(paths)
	for _, path := range paths {
		k.register(ctx, path, seen[path].ModTime())
	}
}

func (k *kubelet) register(ctx context.Context, regPath string, mtime time.Time) {
	conn, err := grpc.NewClient("unix://"+regPath, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		k.rec.record(event{Event: "registration-failed", Endpoint: regPath, Error: err.Error()})
		return
	}
	defer conn.Close()
	reg := registerapi.NewRegistrationClient(conn)
	infoCtx, cancel := context.WithTimeout(ctx, time.Second)
	info, err := reg.GetInfo(infoCtx, &registerapi.InfoRequest{})
	cancel()
	if err != nil {
		// A socket that does not answer yet is retried on the next scan, as kubelet's backoff does.
		return
	}
	notify := func(ok bool, msg string) {
		nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, _ = reg.NotifyRegistrationStatus(nctx, &registerapi.RegistrationStatus{PluginRegistered: ok, Error: msg})
	}
	fail := func(msg string) {
		k.rec.record(event{Event: "registration-rejected", Driver: info.GetName(), Endpoint: info.GetEndpoint(), Versions: info.GetSupportedVersions(), Error: msg})
		notify(false, msg)
		// Remember the rejected socket so it is not re-tried every scan; a new socket is a new try.
		k.mu.Lock()
		k.rejected[regPath] = mtime
		k.mu.Unlock()
	}
	if info.GetType() != registerapi.DRAPlugin {
		fail(fmt.Sprintf("plugin type %q is not %q", info.GetType(), registerapi.DRAPlugin))
		return
	}
	if info.GetName() == "" {
		fail("plugin name is empty")
		return
	}
	service := ""
	for _, v := range info.GetSupportedVersions() {
		if v == drav1.DRAPluginService || v == drav1beta1.DRAPluginService {
			service = v
			break
		}
	}
	if service == "" {
		fail(fmt.Sprintf("none of the supported versions %v is %s or %s", info.GetSupportedVersions(), drav1.DRAPluginService, drav1beta1.DRAPluginService))
		return
	}
	endpoint := info.GetEndpoint()
	if endpoint == "" {
		endpoint = regPath
	}
	if !filepath.IsAbs(endpoint) {
		fail(fmt.Sprintf("endpoint %q is not an absolute path", endpoint))
		return
	}
	draConn, err := grpc.NewClient("unix://"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fail(err.Error())
		return
	}
	draConn.Connect()
	k.mu.Lock()
	if old, ok := k.plugins[info.GetName()]; ok {
		_ = old.conn.Close()
	}
	k.plugins[info.GetName()] = &draPlugin{driver: info.GetName(), endpoint: endpoint, service: service, conn: draConn, regPath: regPath, regMtime: mtime}
	k.mu.Unlock()
	notify(true, "")
	k.rec.record(event{Event: "registered", Driver: info.GetName(), Endpoint: endpoint, Versions: info.GetSupportedVersions(), Service: service})
	// Pods that waited for this driver can go ahead now.
	for _, key := range k.podLister.ListKeys() {
		k.queue.Add(key)
	}
}

func (k *kubelet) pluginFor(driver string) (*draPlugin, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	p, ok := k.plugins[driver]
	if !ok {
		return nil, fmt.Errorf("DRA driver %s is not registered", driver)
	}
	return p, nil
}
