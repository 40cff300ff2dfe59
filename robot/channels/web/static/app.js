// qunbot web playground. Protocol: robot/channels/web/protocol.py.
// All user and bot text is rendered with textContent: never innerHTML.
'use strict';
(() => {
  const $ = (id) => document.getElementById(id);
  const el = (tag, cls, text) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  };
  const store = {
    get(key, fallback) {
      try { const v = localStorage.getItem('qunbot.' + key); return v === null ? fallback : JSON.parse(v); } catch (e) { return fallback; }
    },
    set(key, value) { try { localStorage.setItem('qunbot.' + key, JSON.stringify(value)); } catch (e) { /* private mode */ } },
  };

  const S = {
    botName: 'qunbot', groupId: 'playground', maxLen: 8000,  // maxLen: the welcome's max_text_len
    presets: [], extra: store.get('extraMembers', []), meId: store.get('me', null), mode: store.get('mode', 'group'),
    chats: new Map(),   // chat key -> [item]
    seen: new Set(),    // ids of rendered messages and replies
    streams: new Map(), // run id -> streaming item
    runs: new Map(),    // chat key -> Map(run id -> run)
    panels: new Map(),  // chat key -> panels
    msgById: new Map(), // message id -> message item (labels runs and streaming mentions)
    unread: new Set(),
    ws: null, retry: 0,
  };

  const members = () => [...S.presets, ...S.extra];
  const me = () => members().find((m) => m.id === S.meId) || members()[0] || { id: 'u-guest', name: 'Guest' };
  const keyOf = (chat) => chat.kind + ':' + chat.id;
  const currentChat = () => (S.mode === 'private' ? { kind: 'private', id: me().id } : { kind: 'group', id: S.groupId });
  const currentKey = () => keyOf(currentChat());
  const initial = (name) => (Array.from(name || '?')[0] || '?').toUpperCase();
  // Times in the chat's zone (the one the bot speaks in), not the browser's.
  const hhmm = (iso, zone) => {
    const d = new Date(iso);
    if (isNaN(d)) return '';
    const opts = { hour: '2-digit', minute: '2-digit', hourCycle: 'h23' };
    try { return d.toLocaleTimeString([], zone ? { ...opts, timeZone: zone } : opts); } catch (e) { return d.toLocaleTimeString([], opts); }
  };
  const listOf = (key) => { if (!S.chats.has(key)) S.chats.set(key, []); return S.chats.get(key); };

  // --- connection -------------------------------------------------------------------------
  function connect() {
    const ws = new WebSocket((location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + '/ws');
    S.ws = ws;
    setStatus('connecting', '连接中…');
    ws.onopen = () => { S.retry = 0; setStatus('open', '已连接'); };
    ws.onmessage = (ev) => {
      let frame;
      try { frame = JSON.parse(ev.data); } catch (e) { return; }
      try { handle(frame, false); } catch (e) { console.error('frame failed', frame, e); }
    };
    ws.onclose = () => {
      if (S.ws !== ws) return;
      const delay = Math.min(5000, 300 * 2 ** S.retry++);
      setStatus('closed', '已断开，' + Math.round(delay / 100) / 10 + ' 秒后重连');
      setTimeout(connect, delay);
    };
  }
  function sendFrame(frame) {
    if (!S.ws || S.ws.readyState !== WebSocket.OPEN) { notice('未连接到机器人，请稍候'); return false; }
    S.ws.send(JSON.stringify(frame));
    return true;
  }
  function setStatus(state, text) { const s = $('status'); s.dataset.state = state; s.textContent = text; }
  let noticeTimer = null;
  function notice(text) {
    const n = $('notice'); n.textContent = text; n.hidden = false;
    clearTimeout(noticeTimer); noticeTimer = setTimeout(() => { n.hidden = true; }, 6000);
  }

  // --- frames -----------------------------------------------------------------------------
  function handle(f, replay) {
    switch (f.type) {
      case 'welcome': return onWelcome(f);
      case 'history': f.frames.forEach((x) => handle(x, true)); sortChats(); renderAll(); return;
      case 'message': return onMessage(f, replay);
      case 'delta': return onDelta(f);
      case 'reply': return onReply(f, replay);
      case 'trace': return onTrace(f, replay);
      case 'panels': S.panels.set(keyOf(f.chat), f.panels); if (keyOf(f.chat) === currentKey()) renderPanels(); return;
      case 'error': notice('机器人拒绝了这条消息：' + f.error); return;
      default: return;
    }
  }
  // Stored messages may arrive after newer ones (a chat restored from the store): keep time order.
  function sortChats() {
    for (const list of S.chats.values()) list.sort((a, b) => (Date.parse(a.time) || 0) - (Date.parse(b.time) || 0));
  }
  function onWelcome(f) {
    S.botName = f.bot_name; S.groupId = f.group_id; S.maxLen = f.max_text_len; S.presets = f.members;
    for (const m of [S.chats, S.runs, S.panels, S.streams, S.msgById]) m.clear();
    S.seen.clear(); S.unread.clear();
    document.title = f.bot_name + ' playground';
    $('bot-name').textContent = f.bot_name;
    $('group-label').textContent = f.group_id;
    $('at-bot').textContent = '@' + f.bot_name;
    renderMembers(); renderAll(); requestPanels();
  }
  function addItem(key, item, replay) {
    listOf(key).push(item);
    if (replay) return;
    if (key === currentKey()) appendMessage(item);
    else if (key === keyOf({ kind: 'group', id: S.groupId }) || key === keyOf({ kind: 'private', id: me().id })) {
      S.unread.add(key); renderTabs();
    }
  }
  function onMessage(f, replay) {
    if (S.seen.has(f.id)) return;
    S.seen.add(f.id);
    const item = { id: f.id, who: 'user', sender: f.sender, text: f.text, time: f.time, zone: f.zone };
    S.msgById.set(f.id, item);
    addItem(keyOf(f.chat), item, replay);
  }
  function onDelta(f) {
    const key = keyOf(f.chat);
    let item = S.streams.get(f.run_id);
    if (!item) {
      const asked = S.msgById.get(f.run_id);
      item = { id: 'stream:' + f.run_id, who: 'bot', streaming: true, text: '', time: new Date().toISOString(), zone: asked && asked.zone,
        mention: f.chat.kind === 'group' && asked ? [asked.sender] : [] };
      S.streams.set(f.run_id, item);
      addItem(key, item, false);
    }
    item.text += f.delta;
    const node = item.node && item.node.querySelector('.text');
    if (node) { node.textContent = item.text; scrollDown(); }
  }
  function onReply(f, replay) {
    if (S.seen.has(f.id)) return;
    S.seen.add(f.id);
    const key = keyOf(f.chat);
    const stream = f.reply_to ? S.streams.get(f.reply_to) : null;
    const item = { id: f.id, who: 'bot', text: f.text, time: f.time, zone: f.zone, mention: f.mention || [] };
    if (stream) {
      S.streams.delete(f.reply_to);
      const list = listOf(key);
      const at = list.indexOf(stream);
      if (at >= 0) list.splice(at, 1, item); else list.push(item);
      if (!replay && stream.node && stream.node.isConnected) {
        stream.node.replaceWith(renderMessage(item)); scrollDown();
      } else if (!replay && key === currentKey()) renderMessages();
      return;
    }
    addItem(key, item, replay);
  }
  function onTrace(f, replay) {
    const key = keyOf(f.chat);
    const ev = f.event || {};
    if (!S.runs.has(key)) S.runs.set(key, new Map());
    const runs = S.runs.get(key);
    const id = ev.message_id || '?';
    if (!runs.has(id)) runs.set(id, { id, tools: [], retries: [], end: null });
    const run = runs.get(id);
    if (ev.type === 'tool') run.tools.push(ev);
    else if (ev.type === 'retry') run.retries.push(ev);
    else if (ev.type === 'run_end') {
      run.end = ev;
      // A run that ends without a reply leaves no stream behind.
      const stream = S.streams.get(id);
      if (stream && !stream.text) { S.streams.delete(id); const l = listOf(key); l.splice(l.indexOf(stream), 1); if (stream.node) stream.node.remove(); }
    }
    if (!replay && key === currentKey()) renderTrace();
  }

  // --- rendering --------------------------------------------------------------------------
  function renderAll() { renderTabs(); renderMembers(); renderMessages(); renderTrace(); renderPanels(); }
  function renderTabs() {
    S.unread.delete(currentKey());
    $('tab-group').classList.toggle('active', S.mode === 'group');
    $('tab-private').classList.toggle('active', S.mode === 'private');
    $('private-label').textContent = me().name + ' ↔ ' + S.botName;
    $('tab-group').querySelector('.dot').hidden = !S.unread.has(keyOf({ kind: 'group', id: S.groupId }));
    $('tab-private').querySelector('.dot').hidden = !S.unread.has(keyOf({ kind: 'private', id: me().id }));
  }
  function renderMembers() {
    const box = $('members');
    box.replaceChildren();
    for (const m of members()) {
      const b = el('button', 'member' + (m.id === me().id ? ' active' : ''));
      b.type = 'button'; b.dataset.member = m.id; b.title = m.id;
      b.append(el('span', 'avatar', initial(m.name)), el('span', 'member-name', m.name));
      // Approvers come from [bot] admins / [approvals] approvers ("web:<id>"); the bot checks them, not the page.
      if (m.approver) { b.dataset.approver = '1'; b.title = m.id + '：可以批准请求'; b.append(el('span', 'approver', '可批准')); }
      b.addEventListener('click', () => switchIdentity(m.id));
      box.append(b);
    }
  }
  function renderMessage(item) {
    const self = item.who === 'user' && item.sender.id === me().id;
    const row = el('div', 'msg ' + (item.who === 'bot' ? 'bot' : 'user') + (self ? ' self' : '') + (item.streaming ? ' streaming' : ''));
    row.dataset.id = item.id;
    const name = item.who === 'bot' ? S.botName : item.sender.name;
    row.append(el('div', 'avatar', initial(name)));
    const body = el('div', 'body');
    const meta = el('div', 'meta');
    const time = el('span', 'time', hhmm(item.time, item.zone));
    if (item.zone) time.title = item.zone;
    meta.append(el('span', 'name', name), time);
    const bubble = el('div', 'bubble');
    for (const m of item.mention || []) bubble.append(el('span', 'mention', '@' + m.name + ' '));
    bubble.append(el('span', 'text', item.text));
    body.append(meta, bubble);
    row.append(body);
    item.node = row;
    return row;
  }
  function renderMessages() {
    const box = $('messages');
    const list = S.chats.get(currentKey()) || [];
    box.replaceChildren(...list.map(renderMessage));
    if (!list.length) {
      box.append(el('p', 'empty', S.mode === 'group'
        ? '群里还没有消息。选一个身份发言；@' + S.botName + ' 或以「' + S.botName + '」开头，机器人才会回复。'
        : '这是 ' + me().name + ' 与 ' + S.botName + ' 的私聊，机器人会回复每一条消息。'));
    }
    scrollDown();
  }
  function appendMessage(item) {
    const box = $('messages');
    const empty = box.querySelector('.empty');
    if (empty) empty.remove();
    box.append(renderMessage(item));
    scrollDown();
  }
  function scrollDown() { const box = $('messages'); box.scrollTop = box.scrollHeight; }

  function renderTrace() {
    const box = $('trace');
    const runs = [...(S.runs.get(currentKey()) || new Map()).values()].reverse().slice(0, 20);
    box.replaceChildren();
    if (!runs.length) { box.append(el('p', 'empty', '机器人每次回答用到的工具（包括 /命令）会显示在这里。')); return; }
    for (const run of runs) {
      const card = el('div', 'run');
      const head = el('div', 'run-head');
      const asked = S.msgById.get(run.id);
      head.append(el('span', 'q', asked ? asked.sender.name + '：' + asked.text : 'run ' + run.id.slice(0, 8)));
      const stop = run.end ? run.end.stop : 'running…';
      const ok = run.end && (stop === 'completed' || stop === 'answered_by_tool' || stop === 'command');
      head.append(el('span', 'badge stop' + (run.end ? (ok ? ' ok' : ' bad') : ''), stop));
      card.append(head);
      for (const r of run.retries) card.append(el('div', 'retry', '↻ 重试：' + r.error + '（' + Number(r.delay_s).toFixed(1) + ' s 后）'));
      for (const t of run.tools) {
        const tool = el('div', 'tool' + (t.is_error ? ' error' : ''));
        const th = el('div', 'tool-head');
        th.append(el('span', 'tool-name', t.name), el('span', 'dur', Number(t.duration_ms).toFixed(1) + ' ms'));
        tool.append(th, kv('参数', t.arguments), kv('结果', t.result));
        if (t.note) tool.append(el('div', 'note', t.note));
        card.append(tool);
      }
      if (run.end) {
        const parts = run.end.stop === 'command' ? ['命令，未调用模型']
          : ['stop: ' + run.end.stop, (run.end.tokens || 0) + ' tokens', (run.end.model_calls || 0) + ' 次模型调用'];
        if (run.end.detail) parts.push(run.end.detail);
        card.append(el('div', 'run-end', parts.join(' · ')));
      }
      box.append(card);
    }
  }
  function kv(label, value) {
    const row = el('div', 'kv');
    row.append(el('span', null, label), el('pre', null, value));
    return row;
  }
  function renderPanels() {
    const box = $('panels');
    box.replaceChildren();
    for (const p of S.panels.get(currentKey()) || []) {
      const card = el('section', 'card panel');
      card.dataset.panel = p.name;
      const h = el('h2', null, p.name);
      h.append(el('span', 'hint', '当前会话'));
      card.append(h);
      if (p.error) card.append(el('p', 'note', p.error));
      else if (!p.rows.length) card.append(el('p', 'empty', '（空）'));
      else {
        if (p.actions) card.append(actingAs());
        const ul = el('ul', 'panel-rows');
        p.rows.forEach((row, i) => {
          const li = el('li');
          const entries = Object.entries(row);
          for (const [k, v] of entries) {
            const line = el('div');
            if (entries.length > 1) line.append(el('span', 'k', k));
            line.append(el('span', 'v', v));
            li.append(line);
          }
          const buttons = (p.actions && p.actions[i]) || [];
          const actors = p.actors && p.actors[i];
          if (buttons.length && actors) li.append(mayAct(actors));
          if (buttons.length) {
            const bar = el('div', 'actions');
            for (const a of buttons) {
              const b = el('button', 'ghost action', a.label);
              b.type = 'button'; b.dataset.text = a.text; b.title = '以「' + me().name + '」的身份发送 ' + a.text;
              b.addEventListener('click', () => act(a.text));
              bar.append(b);
            }
            li.append(bar);
          }
          ul.append(li);
        });
        card.append(ul);
      }
      box.append(card);
    }
  }

  // Panel buttons send a /command as the current identity: the bot decides, exactly as if it were typed.
  function actingAs() {
    const line = el('p', 'acting');
    line.append(el('span', null, '按钮以当前身份「' + me().name + '」发送，机器人会核对身份'));
    return line;
  }
  // Per row, who the bot lets press its buttons (the panel's "actors": its requester, or the approvers).
  function mayAct(ids) {
    const line = el('div', 'who');
    const names = ids.map((id) => (members().find((m) => m.id === id) || { name: id }).name);
    if (!names.length) {
      line.append(el('span', 'warn', '可批准：没有（在 [bot] admins 中加入 "web:admin"）'));
      return line;
    }
    const ok = ids.includes(me().id);
    line.append(el('span', null, '可批准：' + names.join('、')), el('span', ok ? 'ok' : 'warn', ok ? '（当前身份可批准）' : '（当前身份不可批准）'));
    return line;
  }
  function act(text) {
    const who = me();
    sendFrame({ type: 'send', kind: S.mode, user: { id: who.id, name: who.name }, text });
  }

  // --- actions ----------------------------------------------------------------------------
  function requestPanels() { if (S.ws && S.ws.readyState === WebSocket.OPEN) sendFrame({ type: 'panels', chat: currentChat() }); }
  function switchChat(mode) {
    S.mode = mode; store.set('mode', mode);
    renderAll(); requestPanels();
  }
  function switchIdentity(id) {
    S.meId = id; store.set('me', id);
    renderAll();
    if (S.mode === 'private') requestPanels();
    $('input').focus();
  }
  // Characters as the bot counts them (an emoji is one). A longer text stays in the box, unsent: no silent cut.
  const tooLong = (text) => { const n = Array.from(text).length; return n > S.maxLen ? '太长：' + n + '/' + S.maxLen + '，请删减后再发送' : ''; };
  function submit() {
    const input = $('input');
    const text = input.value.trim();
    if (!text) return;
    const over = tooLong(text);
    if (over) { notice(over); return; }
    const who = me();
    if (sendFrame({ type: 'send', kind: S.mode, user: { id: who.id, name: who.name }, text })) input.value = '';
  }
  function newId() {
    const bytes = new Uint8Array(4);
    crypto.getRandomValues(bytes);
    return 'u-' + Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
  }

  $('tab-group').addEventListener('click', () => switchChat('group'));
  $('tab-private').addEventListener('click', () => switchChat('private'));
  $('send-form').addEventListener('submit', (e) => { e.preventDefault(); submit(); });
  $('input').addEventListener('input', () => { const over = tooLong($('input').value.trim()); if (over) notice(over); });
  $('input').addEventListener('keydown', (e) => {
    // isComposing: Enter that confirms an IME candidate must not send.
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); submit(); }
  });
  $('at-bot').addEventListener('click', () => {
    const input = $('input');
    const tag = '@' + S.botName + ' ';
    if (!input.value.startsWith(tag)) input.value = tag + input.value;
    input.focus();
  });
  $('add-member').addEventListener('submit', (e) => {
    e.preventDefault();
    const field = $('new-member');
    const name = field.value.trim().slice(0, 32);
    if (!name) return;
    const m = { id: newId(), name };
    S.extra.push(m); store.set('extraMembers', S.extra);
    field.value = '';
    renderMembers(); switchIdentity(m.id);
  });

  renderAll();
  connect();
})();
