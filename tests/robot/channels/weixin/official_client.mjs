// Drives the official iLink client (@tencent-weixin/openclaw-weixin, its compiled dist/) against
// the fake server, so the fake is checked against code we did not write. Our code here is only
// the driver: it stubs the three helpers the package imports from its host framework (openclaw,
// a peer dependency not installed) and calls the package's exported API functions.
// Usage: node official_client.mjs <package dir> <base url> <token> <bad token>
import { register } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

const stub = `
export function normalizeAccountId(id) { return String(id ?? "").trim(); }
export function resolvePreferredOpenClawTmpDir() { return process.env.OPENCLAW_TMP_DIR; }
export async function withFileLock(_p, a, b) { return (typeof a === "function" ? a : b)(); }
`;
const hooks = `
export async function resolve(specifier, context, next) {
  if (specifier.startsWith("openclaw/")) {
    return { url: "data:text/javascript," + encodeURIComponent(${JSON.stringify(stub)}), shortCircuit: true };
  }
  return next(specifier, context);
}`;
register("data:text/javascript," + encodeURIComponent(hooks), import.meta.url);

const [pkgDir, baseUrl, token, badToken] = process.argv.slice(2);
const api = await import(pathToFileURL(path.join(pkgDir, "dist/src/api/api.js")).href);
const pkg = JSON.parse((await import("node:fs")).readFileSync(path.join(pkgDir, "package.json"), "utf-8"));

const out = { version: pkg.version, node: process.version };
out.notifyStart = await api.notifyStart({ baseUrl, token });
const first = await api.getUpdates({ baseUrl, token, get_updates_buf: "", timeoutMs: 5000 });
out.getUpdates = first;
const msg = first.msgs[0];
out.sendMessage = await api.sendMessage({
  baseUrl, token,
  body: { msg: { from_user_id: "", to_user_id: msg.from_user_id, client_id: "official-1", message_type: 2,
                 message_state: 2, item_list: [{ type: 1, text_item: { text: "official reply" } }],
                 context_token: msg.context_token } },
});
const config = await api.getConfig({ baseUrl, token, ilinkUserId: msg.from_user_id, contextToken: msg.context_token });
out.getConfig = config;
await api.sendTyping({ baseUrl, token, body: { ilink_user_id: msg.from_user_id, typing_ticket: config.typing_ticket, status: 1 } });
await api.sendTyping({ baseUrl, token, body: { ilink_user_id: msg.from_user_id, typing_ticket: config.typing_ticket, status: 2 } });
out.afterCursor = await api.getUpdates({ baseUrl, token, get_updates_buf: first.get_updates_buf, timeoutMs: 5000 });
out.expired = await api.getUpdates({ baseUrl, token: badToken, get_updates_buf: "", timeoutMs: 5000 });
try {
  await api.sendMessage({ baseUrl, token, body: { msg: { from_user_id: "", to_user_id: msg.from_user_id, client_id: "official-2",
    message_type: 2, message_state: 2, item_list: [{ type: 1, text_item: { text: "x" } }], context_token: "forged" } } });
  out.forged = "accepted";
} catch (err) {
  out.forged = String(err.message);
}
// The login calls, made with the same helpers and endpoints src/auth/login-qr.ts uses.
out.qrcode = JSON.parse(await api.apiPostFetch({ baseUrl, endpoint: "ilink/bot/get_bot_qrcode?bot_type=3",
                                                 body: JSON.stringify({ local_token_list: [] }), label: "fetchQRCode" }));
out.qrstatus = JSON.parse(await api.apiGetFetch({ baseUrl,
  endpoint: `ilink/bot/get_qrcode_status?qrcode=${encodeURIComponent(out.qrcode.qrcode)}`, timeoutMs: 5000, label: "pollQRStatus" }));
out.notifyStop = await api.notifyStop({ baseUrl, token });
process.stdout.write(JSON.stringify(out));
