// The /ui page: every node of the extender's ledger, one row each, one bar per GPU split by pod.
// Reads ui/nodes once, then ui/changes?since=TOKEN twice a second; renders only the rows in
// view (a node list of 5,000 rows is a spacer of their height and ~40 row elements), and
// builds every element through the DOM (no HTML strings, so the page's strict
// Content-Security-Policy holds; draw.js builds the elements). URLs are relative: the page
// also works through the API server's service proxy. A module: strict, deferred, its own scope.
import { el, gpuDetails, podDetails, rowOf, summaryText } from "./draw.js";

{
  const ROW_H = 44;
  const OVERSCAN = 6;
  const POLL_MS = 500;
  const SUMMARY_MS = 1000;
  const ROOM_REFRESH_MS = 2000;
  // Rows fetched first, to paint at once; every node follows in a second request.
  const FIRST_ROWS = 120;

  const $ = (id) => document.getElementById(id);
  const list = $("list");
  const rowsBox = $("rows");
  const spacer = $("spacer");

  const model = {
    token: null,
    nodes: [], // sorted by name
    byName: new Map(),
    version: 0, // bumped on every change: rows cache their node's version
    inDoubt: new Set(),
    config: {},
    loaded: false, // every node has arrived once
    total: 0, // nodes the extender holds
  };
  const view = {
    shown: [], // nodes passing the filters, in name order
    filters: { node: "", model: "", ns: "" },
    room: null, // {ask, fits: Map node -> Set(gpu index)} while the filter is on
    cache: new Map(), // node name -> {version, el}
    renderQueued: false,
    summaryAt: 0,
    summaryQueued: false,
  };

  // -- model ------------------------------------------------------------------------------

  function prepare(node) {
    const models = new Set();
    const namespaces = new Set();
    for (const g of node.gpus) {
      models.add(g.model);
      for (const p of g.pods) namespaces.add(p.namespace);
      if (g.wholeOwner) namespaces.add(g.wholeOwner.split("/")[0]);
    }
    node._models = models;
    node._ns = namespaces;
    node._v = ++model.version;
    return node;
  }

  function setAll(nodes) {
    model.nodes = nodes.map(prepare).sort(byNodeName);
    model.byName = new Map(model.nodes.map((n) => [n.name, n]));
    view.cache.clear();
  }

  function byNodeName(a, b) {
    return a.name < b.name ? -1 : a.name > b.name ? 1 : 0;
  }

  function applyChanges(answer) {
    let added = false;
    for (const doc of answer.nodes) {
      const old = model.byName.get(doc.name);
      prepare(doc);
      model.byName.set(doc.name, doc);
      if (old) {
        model.nodes[indexOf(doc.name)] = doc;
      } else {
        model.nodes.push(doc);
        added = true;
      }
    }
    if (added) model.nodes.sort(byNodeName);
    if (answer.removed.length) {
      const gone = new Set(answer.removed);
      for (const name of gone) model.byName.delete(name);
      model.nodes = model.nodes.filter((n) => !gone.has(n.name));
    }
    const doubt = new Set(answer.inDoubt);
    const doubtChanged = doubt.size !== model.inDoubt.size || [...doubt].some((u) => !model.inDoubt.has(u));
    model.inDoubt = doubt;
    if (doubtChanged) view.cache.clear();
    return answer.nodes.length + answer.removed.length > 0 || doubtChanged;
  }

  function indexOf(name) {
    let lo = 0;
    let hi = model.nodes.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const here = model.nodes[mid].name;
      if (here === name) return mid;
      if (here < name) lo = mid + 1;
      else hi = mid - 1;
    }
    return -1;
  }

  // -- fetching ---------------------------------------------------------------------------

  async function getJson(url) {
    const resp = await fetch(url, { cache: "no-store" });
    const body = await resp.json();
    if (!resp.ok) throw new Error(body && body.Error ? body.Error : "HTTP " + resp.status);
    return body;
  }

  async function loadAll() {
    if (!model.loaded) {
      // A first screenful, so that the page paints before a large cluster has arrived.
      const first = await getJson("ui/nodes?limit=" + FIRST_ROWS);
      model.config = first.config || {};
      model.total = first.total;
      setAll(first.nodes);
      refilter();
    }
    const doc = await getJson("ui/nodes");
    model.token = doc.token;
    model.config = doc.config || {};
    model.total = doc.total;
    setAll(doc.nodes);
    model.loaded = true;
    fillChoices();
    refilter();
  }

  async function poll() {
    let wait = POLL_MS;
    try {
      const asked = performance.now();
      if (model.token === null) {
        await loadAll();
        note({ at: asked, loadMs: performance.now() - asked, nodes: model.nodes.length });
      } else {
        const answer = await getJson("ui/changes?since=" + encodeURIComponent(model.token));
        const got = performance.now();
        if (answer.reset) {
          model.token = null;
          wait = 0;
        } else {
          model.token = answer.token;
          if (applyChanges(answer)) changed();
        }
        note({
          at: asked,
          fetchMs: got - asked,
          applyMs: performance.now() - got,
          nodes: answer.nodes.length,
          reset: answer.reset,
        });
      }
      setLive(true, "live");
    } catch (err) {
      setLive(false, "disconnected: " + err.message);
      wait = 2000;
    }
    setTimeout(poll, wait);
  }

  // The last polls' timings, for whoever wants to know how live the page is (mpschedUi.stats).
  const recent = [];
  function note(entry) {
    recent.push(entry);
    if (recent.length > 200) recent.shift();
  }

  function setLive(ok, text) {
    const live = $("live");
    live.className = ok ? "live on" : "live off";
    live.textContent = ok ? "live" : "offline";
    live.title = text;
  }

  function changed() {
    fillChoices();
    refilter();
    if (view.room) refreshRoomSoon();
  }

  // -- filters ----------------------------------------------------------------------------

  function fillChoices() {
    const models = new Set();
    const namespaces = new Set();
    for (const n of model.nodes) {
      for (const m of n._models) models.add(m);
      for (const s of n._ns) namespaces.add(s);
    }
    syncOptions($("f-model"), [...models].sort(), true);
    syncOptions($("namespaces"), [...namespaces].sort(), false);
  }

  function syncOptions(box, values, keepFirst) {
    const have = [...box.options].slice(keepFirst ? 1 : 0).map((o) => o.value);
    if (have.length === values.length && have.every((v, i) => v === values[i])) return;
    const chosen = box.value;
    while (box.options.length > (keepFirst ? 1 : 0)) box.lastChild.remove();
    for (const v of values) {
      const o = document.createElement("option");
      o.value = v;
      o.textContent = v;
      box.append(o);
    }
    if (keepFirst) box.value = values.includes(chosen) ? chosen : "";
  }

  function refilter() {
    const f = view.filters;
    const fits = view.room ? view.room.fits : null;
    view.shown = model.nodes.filter(
      (n) =>
        (!f.node || n.name.includes(f.node)) &&
        (!f.model || n._models.has(f.model)) &&
        (!f.ns || n._ns.has(f.ns)) &&
        (!fits || fits.has(n.name)),
    );
    spacer.style.height = view.shown.length * ROW_H + "px";
    $("shown").textContent = model.loaded
      ? view.shown.length + " of " + model.nodes.length + " nodes shown"
      : "loading " + model.total + " nodes…";
    queueRender();
    queueSummary();
  }

  function readFilters() {
    view.filters = { node: $("f-node").value.trim(), model: $("f-model").value, ns: $("f-ns").value.trim() };
    view.cache.clear();
    refilter();
  }

  let roomTimer = null;
  function refreshRoomSoon() {
    if (roomTimer !== null) return;
    roomTimer = setTimeout(() => {
      roomTimer = null;
      if (view.room) findRoom(view.room.ask);
    }, ROOM_REFRESH_MS);
  }

  async function findRoom(ask) {
    const query = new URLSearchParams();
    if (ask.threads) query.set("threads", ask.threads);
    if (ask.memory) query.set("memory", ask.memory);
    if (ask.user) query.set("user", ask.user);
    if (view.filters.ns) query.set("namespace", view.filters.ns);
    const out = $("room-result");
    try {
      const answer = await getJson("status/fit?" + query.toString());
      const fits = new Map(answer.nodes.map((n) => [n.node, new Set(n.gpus)]));
      view.room = { ask, fits };
      const gpus = [...fits.values()].reduce((sum, s) => sum + s.size, 0);
      out.textContent = gpus + " GPUs on " + fits.size + " nodes";
      out.className = "";
    } catch (err) {
      view.room = null;
      out.textContent = err.message;
      out.className = "error";
    }
    document.body.dataset.room = view.room ? "on" : "off";
    view.cache.clear();
    refilter();
  }

  function onRoom(ev) {
    ev.preventDefault();
    const ask = {
      threads: $("room-threads").value.trim(),
      memory: $("room-memory").value.trim(),
      user: $("room-user").value.trim(),
    };
    if (!ask.threads && !ask.memory) {
      clearRoom();
      return;
    }
    findRoom(ask);
  }

  function clearRoom() {
    view.room = null;
    for (const id of ["room-threads", "room-memory", "room-user"]) $(id).value = "";
    $("room-result").textContent = "";
    document.body.dataset.room = "off";
    view.cache.clear();
    refilter();
  }

  // -- rendering --------------------------------------------------------------------------

  function drawing() {
    return { room: view.room, ns: view.filters.ns, inDoubt: model.inDoubt };
  }

  function queueRender() {
    if (view.renderQueued) return;
    view.renderQueued = true;
    requestAnimationFrame(render);
  }

  function render() {
    view.renderQueued = false;
    const top = list.scrollTop;
    const first = Math.max(0, Math.floor(top / ROW_H) - OVERSCAN);
    const last = Math.min(view.shown.length, Math.ceil((top + list.clientHeight) / ROW_H) + OVERSCAN);
    const keep = new Map();
    const els = [];
    for (let i = first; i < last; i++) {
      const node = view.shown[i];
      let hit = view.cache.get(node.name);
      if (!hit || hit.version !== node._v) hit = { version: node._v, el: rowOf(node, drawing()) };
      keep.set(node.name, hit);
      els.push(hit.el);
    }
    view.cache = keep;
    rowsBox.style.transform = "translateY(" + first * ROW_H + "px)";
    rowsBox.replaceChildren(...els);
    if (!document.body.dataset.painted && els.length) {
      document.body.dataset.painted = "1";
      performance.mark("mpsched-first-rows");
    }
  }

  // -- summary ----------------------------------------------------------------------------

  function queueSummary() {
    if (view.summaryQueued) return;
    view.summaryQueued = true;
    const wait = Math.max(0, view.summaryAt + SUMMARY_MS - performance.now());
    setTimeout(summary, wait);
  }

  function summary() {
    view.summaryQueued = false;
    view.summaryAt = performance.now();
    $("summary").textContent = summaryText(model.nodes, model.inDoubt, model.config);
  }

  // -- details ----------------------------------------------------------------------------

  async function showPod(uid) {
    const body = $("details-body");
    $("details").hidden = false;
    body.replaceChildren(el("p", null, "loading…"));
    try {
      const p = await getJson("status/pod/" + encodeURIComponent(uid));
      body.replaceChildren(...podDetails(p, model.inDoubt));
      body.dataset.uid = p.uid;
    } catch (err) {
      body.replaceChildren(el("p", "error", err.message));
    }
  }

  function showGpu(nodeName, index) {
    const node = model.byName.get(nodeName);
    const g = node && node.gpus.find((x) => x.index === index);
    if (!g) return;
    $("details").hidden = false;
    const body = $("details-body");
    body.dataset.uid = "";
    body.replaceChildren(...gpuDetails(nodeName, g));
  }

  function onClick(ev) {
    const seg = ev.target.closest("[data-uid]");
    if (seg && seg.dataset.uid) {
      ev.preventDefault();
      showPod(seg.dataset.uid);
      return;
    }
    const gpu = ev.target.closest(".gpu");
    if (gpu) showGpu(gpu.dataset.node, Number(gpu.dataset.gpu));
  }

  // -- wiring -----------------------------------------------------------------------------

  list.addEventListener("scroll", queueRender, { passive: true });
  window.addEventListener("resize", queueRender);
  rowsBox.addEventListener("click", onClick);
  $("details-body").addEventListener("click", onClick);
  $("details-close").addEventListener("click", () => {
    $("details").hidden = true;
  });
  for (const id of ["f-node", "f-ns"]) $(id).addEventListener("input", readFilters);
  $("f-model").addEventListener("change", readFilters);
  $("filters").addEventListener("submit", onRoom);
  $("room-clear").addEventListener("click", clearRoom);
  document.body.dataset.room = "off";
  // For tests and scripts: the model as the page holds it, read-only.
  window.mpschedUi = {
    nodes: () => model.nodes.length,
    shown: () => view.shown.map((n) => n.name),
    token: () => model.token,
    loaded: () => model.loaded,
    // The rows on the page are the view's: no render is waiting for the next frame.
    drawn: () => !view.renderQueued,
    stats: () => recent.slice(),
    podOn(node, uid) {
      const n = model.byName.get(node);
      return !!n && n.gpus.some((g) => g.pods.some((p) => p.uid === uid));
    },
    scrollToNode(name) {
      const i = view.shown.findIndex((n) => n.name === name);
      if (i >= 0) list.scrollTop = i * ROW_H;
      render();
      return i;
    },
  };
  poll();
}
