// tr serve's chat page: a client of the server's own /v1/chat/completions (streamed), asking for
// the decoding steps ("tr": {"steps": true}) to draw the draft view. Model text only ever reaches
// the page as text nodes (textContent, createTextNode): never as HTML.
'use strict';

(() => {
  const STORE_KEY = 'tr.chat.conversations.v1';
  const SETTINGS_KEY = 'tr.chat.settings.v1';
  const API_KEY = 'tr.chat.apiKey'; // sessionStorage: this tab only
  const SAMPLING = ['temperature', 'top_p', 'top_k', 'repetition_penalty', 'max_tokens', 'seed'];
  const INTEGERS = new Set(['top_k', 'max_tokens', 'seed']);
  const SOURCES = { matrix: 'matrix', lookup: 'prompt lookup', store: 'store', grammar: 'grammar', text: 'text lookup' };
  const TREE_NODES_SHOWN = 120;
  const VISIBLE = { ' ': '␣', '\n': '↵', '\t': '⇥', '\r': '␍' };

  const $ = (id) => document.getElementById(id);
  const ui = {
    app: $('app'), sidebar: $('sidebar'), scrim: $('scrim'), list: $('conversations'), newChat: $('new-chat'),
    title: $('title'), model: $('model'), messages: $('messages'), empty: $('empty'), emptyModel: $('empty-model'),
    composer: $('composer'), prompt: $('prompt'), send: $('send'), stop: $('stop'), status: $('status'),
    settings: $('settings'), toggleSettings: $('toggle-settings'), toggleSidebar: $('toggle-sidebar'),
    system: $('system'), showDrafts: $('show-drafts'),
    keyDialog: $('key-dialog'), keyForm: $('key-form'), keyInput: $('key-input'), keyWhy: $('key-why'), keyCancel: $('key-cancel'),
  };

  // ---- small DOM helpers ----------------------------------------------------------------------
  function el(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === 'class') node.className = value;
      else if (name === 'text') node.textContent = value;
      else if (name.startsWith('on')) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? '' : value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === 'string' ? document.createTextNode(child) : child);
    }
    return node;
  }
  const fmt = (value, digits) => (Number.isFinite(value) ? value.toFixed(digits) : '–');
  const plural = (count, word) => `${word}${count === 1 ? '' : 's'}`;
  const visible = (text) => {
    if (text === '') return '∅';
    if (/^\s+$/.test(text)) return [...text].map((c) => VISIBLE[c] || c).join('');
    return text.replace(/[\n\t\r]/g, (c) => VISIBLE[c]);
  };
  const sourceName = (source) => SOURCES[source] || source;
  const sourceClass = (source) => 'src-' + (SOURCES[source] ? source : 'draft');

  // ---- a small, safe Markdown subset: fenced code, inline code, bold, headings, lists ----------
  function renderInline(text, into) {
    const pattern = /(`+)([^`]|[^`][\s\S]*?[^`])\1(?!`)|\*\*([^*\n][\s\S]*?)\*\*/g;
    let last = 0;
    for (const match of text.matchAll(pattern)) {
      if (match.index > last) into.append(document.createTextNode(text.slice(last, match.index)));
      if (match[2] !== undefined) into.append(el('code', { text: match[2] }));
      else into.append(el('strong', { text: match[3] }));
      last = match.index + match[0].length;
    }
    if (last < text.length) into.append(document.createTextNode(text.slice(last)));
    return into;
  }

  function codeBlock(language, code) {
    const copy = el('button', { type: 'button', text: 'Copy', 'aria-label': 'Copy the code' });
    copy.addEventListener('click', () => copyText(code, copy));
    return el('div', { class: 'codeblock' },
      el('div', { class: 'code-head' }, el('span', { text: language || 'code' }), copy),
      el('pre', {}, el('code', { text: code })));
  }

  const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([^\s`]*)/;
  const LIST_ITEM = /^\s{0,3}([-*+]|\d{1,3}[.)])\s+(.*)$/;
  const HEADING = /^\s{0,3}(#{1,6})\s+(.*)$/;

  function renderMarkdown(text, into) {
    into.replaceChildren();
    const lines = text.split('\n');
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      const fence = line.match(FENCE);
      if (fence) {
        const body = [];
        i += 1;
        while (i < lines.length && !lines[i].trimStart().startsWith(fence[1])) body.push(lines[i++]);
        i += 1; // the closing fence (or the end of a reply still streaming)
        into.append(codeBlock(fence[2], body.join('\n')));
        continue;
      }
      if (!line.trim()) { i += 1; continue; }
      const heading = line.match(HEADING);
      if (heading) {
        into.append(renderInline(heading[2], el('h' + Math.min(6, heading[1].length + 2))));
        i += 1;
        continue;
      }
      const item = line.match(LIST_ITEM);
      if (item) {
        const ordered = /\d/.test(item[1]);
        const list = el(ordered ? 'ol' : 'ul');
        if (ordered && parseInt(item[1], 10) !== 1) list.setAttribute('start', parseInt(item[1], 10));
        while (i < lines.length) {
          const next = lines[i].match(LIST_ITEM);
          if (!next || /\d/.test(next[1]) !== ordered) break;
          list.append(renderInline(next[2], el('li')));
          i += 1;
        }
        into.append(list);
        continue;
      }
      const paragraph = [];
      while (i < lines.length && lines[i].trim() && !FENCE.test(lines[i]) && !LIST_ITEM.test(lines[i]) && !HEADING.test(lines[i])) {
        paragraph.push(lines[i++]);
      }
      into.append(renderInline(paragraph.join('\n'), el('p')));
    }
  }

  async function copyText(text, button) {
    try {
      await navigator.clipboard.writeText(text);
      button.textContent = 'Copied';
    } catch {
      button.textContent = 'Copy failed';
    }
    setTimeout(() => { button.textContent = 'Copy'; }, 1500);
  }

  // ---- storage ----------------------------------------------------------------------------------
  const state = { conversations: [], current: null, model: null, streaming: null };

  function loadStore() {
    try {
      const saved = JSON.parse(localStorage.getItem(STORE_KEY) || 'null');
      if (saved && Array.isArray(saved.conversations)) {
        state.conversations = saved.conversations;
        state.current = saved.current;
      }
    } catch { /* a damaged store starts afresh */ }
    if (!state.conversations.some((c) => c.id === state.current)) state.current = state.conversations[0]?.id || null;
  }

  // Steps are kept without their trees (the drafted alternatives): localStorage holds ~5 MB.
  const compactStep = (step) => ({
    index: step.index, ms: step.ms, drafted: step.drafted, new_tokens: step.new_tokens,
    mean_accepted_tokens: step.mean_accepted_tokens, tokens_per_second: step.tokens_per_second,
    accepted: step.accepted.map((t) => ({ text: t.text, source: t.source })),
    bonus: step.bonus ? { text: step.bonus.text } : null,
  });
  const compactMessage = (m) => ({ ...m, steps: m.steps ? m.steps.map(compactStep) : undefined });

  function saveStore() {
    const write = (conversations) => localStorage.setItem(STORE_KEY, JSON.stringify({
      current: state.current, conversations: conversations.map((c) => ({ ...c, messages: c.messages.map(compactMessage) })),
    }));
    try {
      write(state.conversations);
    } catch {
      // Over the quota: keep every text, drop the draft steps of all but the current conversation.
      try {
        write(state.conversations.map((c) => (c.id === state.current ? c
          : { ...c, messages: c.messages.map((m) => ({ ...m, steps: undefined })) })));
      } catch { announce('The browser refused to store the conversation (storage full).'); }
    }
  }

  function loadSettings() {
    let saved = {};
    try { saved = JSON.parse(localStorage.getItem(SETTINGS_KEY) || '{}') || {}; } catch { saved = {}; }
    ui.system.value = saved.system || '';
    for (const name of SAMPLING) $(name).value = saved[name] ?? '';
    ui.showDrafts.checked = saved.drafts !== false;
  }

  function saveSettings() {
    const settings = { system: ui.system.value, drafts: ui.showDrafts.checked };
    for (const name of SAMPLING) settings[name] = $(name).value;
    localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings));
  }

  function sampling() {
    const fields = {};
    for (const name of SAMPLING) {
      const input = $(name);
      if (input.value.trim() === '' || !input.checkValidity()) continue;
      const value = Number(input.value);
      if (Number.isFinite(value)) fields[name] = INTEGERS.has(name) ? Math.round(value) : value;
    }
    return fields;
  }

  const current = () => state.conversations.find((c) => c.id === state.current) || null;

  function newConversation() {
    const conversation = { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 7)}`, title: 'New chat', created: Date.now(), messages: [] };
    state.conversations.unshift(conversation);
    state.current = conversation.id;
    return conversation;
  }

  // ---- the API key -----------------------------------------------------------------------------
  function askKey(refused) {
    ui.keyWhy.textContent = refused
      ? 'That key was refused. Enter the key this server was started with (--api-key).'
      : 'This server was started with --api-key. The key is kept for this tab only.';
    ui.keyInput.value = '';
    return new Promise((resolve) => {
      const done = (key) => {
        ui.keyForm.removeEventListener('submit', submit);
        ui.keyCancel.removeEventListener('click', cancel);
        ui.keyDialog.removeEventListener('cancel', cancel);
        if (ui.keyDialog.open) ui.keyDialog.close();
        resolve(key);
      };
      const submit = (event) => { event.preventDefault(); done(ui.keyInput.value.trim() || null); };
      const cancel = (event) => { event.preventDefault(); done(null); };
      ui.keyForm.addEventListener('submit', submit);
      ui.keyCancel.addEventListener('click', cancel);
      ui.keyDialog.addEventListener('cancel', cancel);
      ui.keyDialog.showModal();
      ui.keyInput.focus();
    });
  }

  // fetch with the tab's key; a 401 asks for the key (once per refusal) and tries again.
  async function api(path, options = {}) {
    let refused = false;
    for (;;) {
      const headers = { ...(options.headers || {}) };
      const key = sessionStorage.getItem(API_KEY);
      if (key) headers.Authorization = `Bearer ${key}`;
      const response = await fetch(path, { ...options, headers });
      if (response.status !== 401) return response;
      sessionStorage.removeItem(API_KEY);
      const entered = await askKey(refused || Boolean(key));
      if (!entered) return response;
      sessionStorage.setItem(API_KEY, entered);
      refused = true;
    }
  }

  async function errorText(response) {
    try {
      const body = await response.json();
      return body?.error?.message || `HTTP ${response.status}`;
    } catch {
      return `HTTP ${response.status}`;
    }
  }

  async function loadModel() {
    try {
      const response = await api('/v1/models');
      if (!response.ok) throw new Error(await errorText(response));
      const body = await response.json();
      state.model = body.data?.[0]?.id || null;
      ui.model.textContent = state.model || 'no model';
      ui.model.className = 'model ok';
      ui.emptyModel.textContent = state.model || 'the model';
    } catch (error) {
      ui.model.textContent = error.message.length > 40 ? 'not connected' : error.message;
      ui.model.title = error.message;
      ui.model.className = 'model bad';
    }
  }

  // ---- rendering --------------------------------------------------------------------------------
  function announce(text) { ui.status.textContent = text; }

  function renderSidebar() {
    ui.list.replaceChildren();
    for (const conversation of state.conversations) {
      const isCurrent = conversation.id === state.current;
      const open = el('button', { type: 'button', class: 'open', text: conversation.title || 'New chat', 'aria-current': isCurrent ? 'true' : null });
      open.addEventListener('click', () => { if (!state.streaming) { state.current = conversation.id; saveStore(); renderAll(); closeSidebar(); ui.prompt.focus(); } });
      const remove = el('button', { type: 'button', class: 'delete', text: '×', 'aria-label': `Delete conversation: ${conversation.title}` });
      remove.addEventListener('click', () => deleteConversation(conversation.id));
      ui.list.append(el('li', { class: isCurrent ? 'current' : null }, open, remove));
    }
  }

  function deleteConversation(id) {
    if (state.streaming && state.streaming.conversation.id === id) return;
    state.conversations = state.conversations.filter((c) => c.id !== id);
    if (state.current === id) state.current = state.conversations[0]?.id || null;
    saveStore();
    renderAll();
  }

  function statsLine(message) {
    const tr = message.stats;
    if (!tr) return null;
    const parts = [];
    const tokens = message.usage?.completion_tokens;
    if (tokens !== undefined) parts.push(['', `${tokens} ${plural(tokens, 'token')}`]);
    parts.push(['MAT ', fmt(tr.mean_accepted_tokens, 2)], ['', `${fmt(tr.tokens_per_second, 1)} tok/s`], ['', `${tr.steps} ${plural(tr.steps, 'step')}`]);
    if (tr.prefill_tokens !== undefined) {
      const reused = tr.prompt_tokens_reused ? ` (${tr.prompt_tokens_reused} reused)` : '';
      parts.push(['', `prefill ${tr.prefill_tokens} ${plural(tr.prefill_tokens, 'token')}${reused}`]);
    }
    const line = el('div', { class: 'stats' });
    parts.forEach(([label, value], n) => {
      if (n) line.append(' · ');
      line.append(label, el('b', { text: value }));
    });
    return line;
  }

  // The draft view of one reply: per step its accepted tokens (coloured by source) and the model's
  // own token; a step chosen (click, focus) shows its whole drafted tree.
  class DraftView {
    constructor(message, live) {
      this.message = message;
      this.selected = null;
      this.root = el('details', { class: 'drafts' });
      this.root.open = live || message.draftsOpen === true;
      this.root.addEventListener('toggle', () => { message.draftsOpen = this.root.open; });
      this.summary = el('summary');
      this.legend = el('div', { class: 'legend', 'aria-hidden': 'true' });
      this.strip = el('div', { class: 'steps', role: 'list', 'aria-label': 'Decoding steps' });
      this.detail = el('div', { class: 'detail' });
      this.root.append(this.summary, el('div', { class: 'body' }, this.legend, this.strip, this.detail));
      for (const step of message.steps || []) this.strip.append(this.stepChip(step));
      this.update();
    }

    totals() {
      const accepted = {};
      let drafts = 0;
      let tokens = 0;
      for (const step of this.message.steps || []) {
        tokens += step.new_tokens ?? step.accepted.length + (step.bonus ? 1 : 0);
        for (const t of step.accepted) {
          accepted[t.source] = (accepted[t.source] || 0) + 1;
          drafts += 1;
        }
      }
      return { accepted, drafts, tokens };
    }

    update() {
      const steps = this.message.steps || [];
      const last = steps[steps.length - 1];
      const { accepted, drafts, tokens } = this.totals();
      const decoding = steps.filter((s) => s.index > 0).length;
      this.summary.replaceChildren(el('span', { class: 'label', text: 'Draft view' }));
      const live = el('span', { class: 'live' });
      live.append(el('b', { text: String(decoding) }), ` ${plural(decoding, 'step')} · `, el('b', { text: `${drafts}/${tokens}` }),
        ` ${plural(tokens, 'token')} drafted`);
      if (last) {
        live.append(' · MAT ', el('b', { text: fmt(last.mean_accepted_tokens, 2) }),
          ' · ', el('b', { text: fmt(last.tokens_per_second, 1) }), ' tok/s');
      }
      this.summary.append(live);
      this.legend.replaceChildren();
      for (const source of Object.keys(SOURCES)) {
        if (!accepted[source] && source !== 'matrix') continue;
        this.legend.append(el('span', { class: sourceClass(source) }, el('i'), `${sourceName(source)} ${accepted[source] || 0}`));
      }
      this.legend.append(el('span', {}, el('i', { class: 'bonus' }), "the model's own token"));
      if (this.selected === null && last) this.showDetail(last);
      this.tabStop();
    }

    stepChip(step) {
      const label = step.index === 0 ? 'prefill, first token' : `step ${step.index}, ${step.accepted.length} drafted ${plural(step.accepted.length, 'token')} accepted`;
      // One tab stop for the whole strip (the chosen step); arrows move between steps.
      const chip = el('button', { type: 'button', class: 'step', role: 'listitem', 'aria-label': label, tabindex: '-1' });
      for (const token of step.accepted) {
        chip.append(el('span', { class: `tok ${sourceClass(token.source)}`, title: sourceName(token.source), text: visible(token.text) }));
      }
      if (step.bonus) chip.append(el('span', { class: 'tok bonus', title: "the model's own token", text: visible(step.bonus.text) }));
      chip.step = step;
      chip.addEventListener('click', () => this.select(chip));
      chip.addEventListener('focus', () => this.select(chip));
      chip.addEventListener('keydown', (event) => this.move(event, chip));
      return chip;
    }

    select(chip) {
      const before = this.strip.querySelector('.step.selected');
      if (before) { before.classList.remove('selected'); before.setAttribute('aria-current', 'false'); }
      this.strip.querySelectorAll('.step[tabindex="0"]').forEach((c) => c.setAttribute('tabindex', '-1'));
      chip.classList.add('selected');
      chip.setAttribute('aria-current', 'true');
      chip.setAttribute('tabindex', '0');
      this.selected = chip.step;
      this.showDetail(chip.step);
    }

    move(event, chip) {
      const chips = [...this.strip.children];
      const at = chips.indexOf(chip);
      const to = { ArrowLeft: at - 1, ArrowUp: at - 1, ArrowRight: at + 1, ArrowDown: at + 1, Home: 0, End: chips.length - 1 }[event.key];
      if (to === undefined) return;
      event.preventDefault();
      chips[Math.max(0, Math.min(chips.length - 1, to))].focus();
    }

    add(step) {
      const chip = this.stepChip(step);
      this.strip.append(chip);
      this.strip.scrollTop = this.strip.scrollHeight;
      this.update();
    }

    tabStop() {
      // Without a chosen step, the last one takes the strip's tab stop.
      if (!this.strip.querySelector('.step[tabindex="0"]') && this.strip.lastElementChild) {
        this.strip.lastElementChild.setAttribute('tabindex', '0');
      }
    }

    showDetail(step) {
      const head = el('div', { class: 'head' });
      if (step.index === 0) {
        head.append(el('b', { text: 'Prefill' }), ` · ${fmt(step.ms, 0)} ms · the first token comes from the prompt's forward; nothing is drafted`);
        this.detail.replaceChildren(head);
        return;
      }
      const drafted = Object.entries(step.drafted || {});
      const count = drafted.reduce((sum, [, n]) => sum + n, 0);
      head.append(el('b', { text: `Step ${step.index}` }), ` · ${fmt(step.ms, 1)} ms · drafted `, el('b', { text: String(count) }));
      if (drafted.length) head.append(` (${drafted.map(([source, n]) => `${sourceName(source)} ${n}`).join(', ')})`);
      head.append(' · accepted ', el('b', { text: String(step.accepted.length) }), step.bonus ? ' + the model\'s own token' : '');
      this.detail.replaceChildren(head);
      if (step.tree && step.root) this.detail.append(this.tree(step));
      else if (count) this.detail.append(el('div', { class: 'head', text: 'The drafted tree is shown for replies decoded since this page loaded.' }));
    }

    tree(step) {
      const children = new Map();
      step.tree.forEach((node, n) => {
        const parent = node.parent;
        if (!children.has(parent)) children.set(parent, []);
        children.get(parent).push(n + 1);
      });
      const accepted = new Set(step.accepted.map((t) => t.node));
      const lastAccepted = step.accepted.length ? step.accepted[step.accepted.length - 1].node : 0;
      let shown = 0;
      const chip = (index) => {
        shown += 1;
        const node = step.tree[index - 1];
        const taken = accepted.has(index);
        return el('span', {
          class: `tok ${sourceClass(node.source)}${taken ? '' : ' rejected'}`,
          title: `${sourceName(node.source)}${taken ? ', accepted' : ', rejected'}`,
          text: visible(node.text),
        });
      };
      const bonus = () => el('span', { class: 'tok bonus', title: "the model's own token", text: visible(step.bonus.text) });
      const branch = (index) => {
        // A chain of single children on one line; accepted children first.
        const line = el('li');
        let at = index;
        line.append(chip(at));
        for (;;) {
          if (at === lastAccepted && step.bonus) { line.append(el('span', { class: 'arrow', text: '⇒' }), bonus()); }
          const kids = children.get(at) || [];
          if (kids.length !== 1 || shown >= TREE_NODES_SHOWN) break;
          at = kids[0];
          line.append(el('span', { class: 'arrow', text: '→' }), chip(at));
        }
        const kids = children.get(at) || [];
        if (kids.length > 1) line.append(list(kids));
        return line;
      };
      // Children with children of their own get a line each (accepted first); leaves share one line.
      const list = (kids) => {
        const ul = el('ul');
        const ordered = [...kids].sort((a, b) => accepted.has(b) - accepted.has(a));
        const isLeaf = (kid) => !children.has(kid) && !(kid === lastAccepted && step.bonus);
        const leaves = el('li', { class: 'leaves' });
        for (const kid of ordered) {
          if (shown >= TREE_NODES_SHOWN) {
            ul.append(el('li', { class: 'more', text: `… ${step.tree.length - shown} more nodes` }));
            break;
          }
          if (isLeaf(kid)) leaves.append(chip(kid));
          else ul.append(branch(kid));
        }
        if (leaves.childElementCount) ul.append(leaves);
        return ul;
      };
      const top = el('li', {}, el('span', { class: 'tok', title: 'the root: the last token before this step', text: visible(step.root.text) }));
      if (lastAccepted === 0 && step.bonus) top.append(el('span', { class: 'arrow', text: '⇒' }), bonus());
      const kids = children.get(0) || [];
      if (kids.length) top.append(list(kids));
      return el('ul', { class: 'tree', 'aria-label': `The tree drafted at step ${step.index}` }, top);
    }
  }

  function messageView(message, index, conversation) {
    const isLast = index === conversation.messages.length - 1;
    const lastUser = conversation.messages.map((m) => m.role).lastIndexOf('user');
    const streamingThis = state.streaming && state.streaming.message === message;
    if (message.role === 'user') {
      const view = el('article', { class: 'msg user', 'aria-label': 'You' },
        el('div', { class: 'who', text: 'You' }), el('div', { class: 'bubble', text: message.content }));
      if (index === lastUser && !state.streaming) {
        const edit = el('button', { type: 'button', class: 'small', text: 'Edit', 'aria-label': 'Edit your last message' });
        edit.addEventListener('click', () => startEdit(view, message, conversation));
        view.append(el('div', { class: 'actions' }, edit));
      }
      return view;
    }
    const bubble = el('div', { class: 'bubble', 'aria-live': streamingThis ? 'polite' : null, 'aria-busy': streamingThis ? 'true' : null });
    renderMarkdown(message.content, bubble);
    const view = el('article', { class: 'msg assistant', 'aria-label': message.model || 'Assistant' },
      el('div', { class: 'who', text: message.model || 'assistant' }), bubble);
    const parts = { view, bubble, drafts: null, footer: el('div') };
    if (message.stopped) view.append(el('div', { class: 'stopped', text: 'Stopped.' }));
    if (message.error) view.append(el('div', { class: 'error', role: 'alert', text: message.error }));
    if (message.steps) {
      parts.drafts = new DraftView(message, streamingThis);
      view.append(parts.drafts.root);
    }
    view.append(parts.footer);
    fillFooter(parts.footer, message, isLast && !state.streaming);
    parts.message = message;
    return parts;
  }

  function fillFooter(footer, message, withActions) {
    footer.replaceChildren();
    const stats = statsLine(message);
    if (stats) footer.append(stats);
    if (!withActions) return;
    const regenerate = el('button', { type: 'button', class: 'small', text: 'Regenerate', 'aria-label': 'Regenerate the last reply' });
    regenerate.addEventListener('click', () => regenerateLast());
    const copy = el('button', { type: 'button', class: 'small', text: 'Copy', 'aria-label': 'Copy the reply' });
    copy.addEventListener('click', () => copyText(message.content, copy));
    footer.append(el('div', { class: 'actions' }, regenerate, copy));
  }

  function renderMessages() {
    const conversation = current();
    const views = [];
    ui.messages.replaceChildren();
    if (!conversation || !conversation.messages.length) {
      ui.messages.append(ui.empty);
      return views;
    }
    conversation.messages.forEach((message, index) => {
      const view = messageView(message, index, conversation);
      ui.messages.append(view.view || view);
      views.push(view);
    });
    ui.messages.scrollTop = ui.messages.scrollHeight;
    return views;
  }

  function renderAll() {
    const conversation = current();
    ui.title.textContent = conversation ? conversation.title : 'New chat';
    document.title = conversation && conversation.messages.length ? `${conversation.title} · tr chat` : 'tr chat';
    renderSidebar();
    return renderMessages();
  }

  function setStreaming(on) {
    ui.send.hidden = on;
    ui.stop.hidden = !on;
    ui.newChat.disabled = on;
  }

  // ---- editing and regenerating -----------------------------------------------------------------
  function startEdit(view, message, conversation) {
    const area = el('textarea', { 'aria-label': 'Edit your message' });
    area.value = message.content;
    const save = el('button', { type: 'button', class: 'primary', text: 'Send' });
    const cancel = el('button', { type: 'button', class: 'ghost', text: 'Cancel' });
    const editor = el('div', { class: 'editor' }, area, el('div', { class: 'actions' }, save, cancel));
    view.replaceChildren(el('div', { class: 'who', text: 'You' }), editor);
    area.focus();
    const commit = () => {
      const text = area.value.trim();
      if (!text) return;
      const at = conversation.messages.indexOf(message);
      conversation.messages.splice(at);
      if (at === 0) conversation.title = titleOf(text);
      conversation.messages.push({ role: 'user', content: text });
      saveStore();
      complete(conversation);
    };
    save.addEventListener('click', commit);
    cancel.addEventListener('click', () => { renderMessages(); ui.prompt.focus(); });
    area.addEventListener('keydown', (event) => {
      if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) { event.preventDefault(); commit(); }
      if (event.key === 'Escape') { renderMessages(); ui.prompt.focus(); }
    });
  }

  function regenerateLast() {
    const conversation = current();
    if (!conversation || state.streaming) return;
    while (conversation.messages.length && conversation.messages[conversation.messages.length - 1].role === 'assistant') {
      conversation.messages.pop();
    }
    if (!conversation.messages.length) return;
    complete(conversation);
  }

  // ---- sending and streaming --------------------------------------------------------------------
  const titleOf = (text) => {
    const line = text.replace(/\s+/g, ' ').trim();
    return line.length > 48 ? `${line.slice(0, 47)}…` : line;
  };

  function send(text) {
    if (state.streaming) return;
    text = text.trim();
    if (!text) return;
    const conversation = current() || newConversation();
    if (!conversation.messages.length) conversation.title = titleOf(text);
    conversation.messages.push({ role: 'user', content: text });
    ui.prompt.value = '';
    autoSize();
    saveStore();
    complete(conversation);
  }

  async function* serverEvents(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, '\n');
      let cut;
      while ((cut = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = block.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).replace(/^ /, '')).join('\n');
        if (data) yield data; // comment lines (": waiting") carry no data
      }
    }
  }

  async function complete(conversation) {
    if (!state.model) await loadModel();
    if (!state.model) {
      conversation.messages.push({ role: 'assistant', content: '', error: `The server did not name its model: ${ui.model.title || ui.model.textContent}` });
      saveStore();
      renderAll();
      return;
    }
    const drafts = ui.showDrafts.checked;
    const message = { role: 'assistant', content: '', model: state.model, steps: drafts ? [] : undefined };
    const history = conversation.messages.map((m) => ({ role: m.role, content: m.content }));
    if (ui.system.value.trim()) history.unshift({ role: 'system', content: ui.system.value.trim() });
    conversation.messages.push(message);
    const controller = new AbortController();
    state.streaming = { conversation, message, controller };
    setStreaming(true);
    const views = renderAll();
    const view = views[views.length - 1];
    view.bubble.classList.add('cursor');
    announce('Generating a reply…');
    let renderPending = false;
    const renderSoon = () => {
      if (renderPending) return;
      renderPending = true;
      requestAnimationFrame(() => {
        renderPending = false;
        renderMarkdown(message.content, view.bubble);
        const nearBottom = ui.messages.scrollHeight - ui.messages.scrollTop - ui.messages.clientHeight < 160;
        if (nearBottom) ui.messages.scrollTop = ui.messages.scrollHeight;
      });
    };
    const body = {
      model: state.model, messages: history, stream: true,
      stream_options: { include_usage: true }, ...sampling(),
    };
    if (drafts) body.tr = { steps: true };
    try {
      const response = await api('/v1/chat/completions', {
        method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal: controller.signal,
      });
      if (!response.ok) throw new Error(await errorText(response));
      for await (const data of serverEvents(response)) {
        if (data === '[DONE]') break;
        const chunk = JSON.parse(data);
        if (chunk.error) { message.error = chunk.error.message; break; }
        const choice = chunk.choices && chunk.choices[0];
        const text = choice?.delta?.content;
        if (text) { message.content += text; renderSoon(); }
        if (chunk.tr?.step && message.steps) {
          message.steps.push(chunk.tr.step);
          view.drafts?.add(chunk.tr.step);
        } else if (chunk.tr && chunk.tr.mean_accepted_tokens !== undefined) {
          message.stats = chunk.tr;
        }
        if (choice?.finish_reason) message.finish = choice.finish_reason;
        if (chunk.usage) message.usage = chunk.usage;
      }
    } catch (error) {
      if (error.name === 'AbortError') message.stopped = true;
      else message.error = `The request failed: ${error.message}`;
    }
    state.streaming = null;
    setStreaming(false);
    saveStore();
    renderAll();
    announce(message.stopped ? 'Stopped.' : message.error ? `Error: ${message.error}` : 'Reply finished.');
    ui.prompt.focus();
  }

  function stop() {
    if (state.streaming) state.streaming.controller.abort();
  }

  // ---- wiring -----------------------------------------------------------------------------------
  function autoSize() {
    ui.prompt.style.height = 'auto';
    ui.prompt.style.height = `${Math.min(ui.prompt.scrollHeight + 2, window.innerHeight * 0.4)}px`;
  }

  function closeSidebar() {
    ui.app.classList.remove('sidebar-open');
    ui.scrim.hidden = true;
    ui.toggleSidebar.setAttribute('aria-expanded', 'false');
  }

  ui.composer.addEventListener('submit', (event) => { event.preventDefault(); send(ui.prompt.value); });
  ui.prompt.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send(ui.prompt.value);
    }
  });
  ui.prompt.addEventListener('input', autoSize);
  ui.stop.addEventListener('click', stop);
  document.addEventListener('keydown', (event) => {
    if (event.key !== 'Escape' || ui.keyDialog.open) return;
    if (ui.app.classList.contains('sidebar-open')) { closeSidebar(); ui.toggleSidebar.focus(); } else if (state.streaming) stop();
  });
  ui.newChat.addEventListener('click', () => {
    if (state.streaming) return;
    const conversation = current();
    if (!conversation || conversation.messages.length) newConversation();
    saveStore();
    renderAll();
    closeSidebar();
    ui.prompt.focus();
  });
  ui.toggleSettings.addEventListener('click', () => {
    ui.settings.hidden = !ui.settings.hidden;
    ui.toggleSettings.setAttribute('aria-expanded', String(!ui.settings.hidden));
    if (!ui.settings.hidden) ui.system.focus();
  });
  ui.toggleSidebar.addEventListener('click', () => {
    const open = !ui.app.classList.contains('sidebar-open');
    ui.app.classList.toggle('sidebar-open', open);
    ui.scrim.hidden = !open;
    ui.toggleSidebar.setAttribute('aria-expanded', String(open));
    if (open) ui.newChat.focus();
  });
  ui.scrim.addEventListener('click', closeSidebar);
  ui.settings.addEventListener('input', saveSettings);
  ui.settings.addEventListener('change', saveSettings);
  for (const button of document.querySelectorAll('#suggestions button')) {
    button.addEventListener('click', () => send(button.textContent));
  }

  loadSettings();
  loadStore();
  renderAll();
  loadModel();
  ui.prompt.focus();
})();
