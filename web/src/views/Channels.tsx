// Channels (docs/channels.md; docs/api.md, "Channels", "Channel members"): the tenant's chat
// platform bindings, for admins. Lists them (credentials masked, with the webhook URL and where
// to paste what), adds one from its JSON (a template per platform to fill in), deletes after a
// confirm, and edits who is who: the platform user ids mapped to Wuhu names (everyone else in a
// thread is a guest, decision 0035).

import { useCallback, useEffect, useState } from "preact/hooks";
import { api } from "../api";
import type { Identity } from "../auth";
import type { ChannelInfo, ChannelMember } from "../types";
import { ErrorLine, errorText } from "../util";

const TEMPLATES: Record<string, unknown> = {
  slack: { platform: "slack", name: "", teamId: "T…", apiAppId: "A…", credentials: { signingSecret: "", botToken: "xoxb-…" } },
  telegram: { platform: "telegram", name: "", credentials: { botToken: "", secretToken: "" } },
  discord: { platform: "discord", name: "", credentials: { applicationId: "", publicKey: "", botToken: "" } },
  generic: { platform: "generic", name: "", credentials: { secret: "", replyUrl: "https://…" } },
};

export function Channels({ me }: { me: Identity }) {
  const [channels, setChannels] = useState<ChannelInfo[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const refresh = useCallback(async () => {
    try {
      setChannels((await api.channels()).channels);
      setError(null);
    } catch (err) {
      setError(errorText(err));
    }
  }, []);
  useEffect(() => void (me.role === "admin" ? refresh() : undefined), [refresh, me.role]);
  if (me.role !== "admin") {
    return (
      <section class="page channels">
        <h1>Channels</h1>
        <p class="muted">Only the tenant's admins manage chat channels.</p>
      </section>
    );
  }
  return (
    <section class="page channels">
      <h1>Channels</h1>
      <p class="muted">Slack, Telegram, Discord and generic webhooks bound to this tenant. Credentials are never shown again.</p>
      <AddChannel onAdded={refresh} />
      <ErrorLine error={error} />
      {channels === null ? (
        <p class="muted">Loading…</p>
      ) : channels.length === 0 ? (
        <p class="muted">No channels yet.</p>
      ) : (
        channels.map((c) => <ChannelCard key={c.id} channel={c} onDeleted={refresh} />)
      )}
    </section>
  );
}

function AddChannel({ onAdded }: { onAdded: () => void }) {
  const [text, setText] = useState(JSON.stringify(TEMPLATES.generic, null, 2));
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [added, setAdded] = useState<ChannelInfo | null>(null);
  const submit = async (e: Event) => {
    e.preventDefault();
    setError(null);
    let body: unknown;
    try {
      body = JSON.parse(text);
    } catch (err) {
      setError(`Not JSON: ${errorText(err)}`);
      return;
    }
    setBusy(true);
    try {
      setAdded(await api.createChannel(body));
      onAdded();
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <details class="panel">
      <summary>Add a channel</summary>
      <form onSubmit={submit} aria-label="Add a channel">
        <p class="small">
          Start from{" "}
          {Object.keys(TEMPLATES).map((p) => (
            <button key={p} type="button" class="link small" onClick={() => setText(JSON.stringify(TEMPLATES[p], null, 2))}>
              {p}
            </button>
          ))}
        </p>
        <textarea aria-label="Binding JSON" rows={8} class="mono" value={text} onInput={(e) => setText((e.target as HTMLTextAreaElement).value)} />
        <button type="submit" disabled={busy}>
          Add
        </button>
      </form>
      <ErrorLine error={error} />
      {added && (
        <div role="status">
          <p>
            Added {added.platform} channel “{added.name}”. Webhook: <span class="mono">{added.webhookUrl}</span>
          </p>
          <ol class="small">
            {added.setup.map((step) => (
              <li key={step}>{step}</li>
            ))}
          </ol>
        </div>
      )}
    </details>
  );
}

function ChannelCard({ channel, onDeleted }: { channel: ChannelInfo; onDeleted: () => void }) {
  const [confirming, setConfirming] = useState(false);
  const [error, setError] = useState<string | null>(null);
  return (
    <section class="panel" aria-label={`Channel ${channel.name}`} data-testid="channel">
      <h2>
        {channel.name} <span class="muted small">{channel.platform} · admits {channel.admit}</span>
      </h2>
      <p class="small">
        Webhook: <span class="mono">{channel.webhookUrl}</span>
      </p>
      <ul class="plain small mono">
        {Object.entries(channel.credentials).map(([field, masked]) => (
          <li key={field}>
            {field}: {String(masked)}
          </li>
        ))}
      </ul>
      <Members channelId={channel.id} />
      {confirming ? (
        <span class="confirm" role="group" aria-label={`Confirm deleting ${channel.name}`}>
          <button
            type="button"
            class="danger small"
            onClick={async () => {
              try {
                await api.deleteChannel(channel.id);
                onDeleted();
              } catch (err) {
                setError(errorText(err));
              }
            }}
          >
            Yes, delete it
          </button>
          <button type="button" class="secondary small" onClick={() => setConfirming(false)}>
            Cancel
          </button>
        </span>
      ) : (
        <button type="button" class="link small danger-text" onClick={() => setConfirming(true)}>
          Delete
        </button>
      )}
      <ErrorLine error={error} />
    </section>
  );
}

function Members({ channelId }: { channelId: string }) {
  const [members, setMembers] = useState<ChannelMember[] | null>(null);
  const [user, setUser] = useState("");
  const [sub, setSub] = useState("");
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    api.channelMembers(channelId).then(
      (m) => setMembers(m.members),
      (err) => setError(errorText(err)),
    );
  }, [channelId]);
  const save = async (next: ChannelMember[]) => {
    setError(null);
    try {
      setMembers((await api.setChannelMembers(channelId, next)).members);
    } catch (err) {
      setError(errorText(err));
    }
  };
  return (
    <div data-testid="channel-members">
      <h3 class="small">Members (everyone else is a guest)</h3>
      {members !== null && members.length > 0 && (
        <ul class="plain small">
          {members.map((m) => (
            <li key={m.user}>
              <span class="mono">{m.user}</span> → {m.sub}{" "}
              <button type="button" class="link small" aria-label={`Unmap ${m.user}`} onClick={() => void save(members.filter((x) => x.user !== m.user))}>
                Unmap
              </button>
            </li>
          ))}
        </ul>
      )}
      <form
        class="row"
        aria-label="Map a member"
        onSubmit={(e) => {
          e.preventDefault();
          if (!members) return;
          void save([...members.filter((m) => m.user !== user.trim()), { user: user.trim(), sub: sub.trim() }]).then(() => {
            setUser("");
            setSub("");
          });
        }}
      >
        <input aria-label="Platform user id" placeholder="platform user id" value={user} onInput={(e) => setUser((e.target as HTMLInputElement).value)} />{" "}
        <input aria-label="Wuhu name" placeholder="Wuhu name" value={sub} onInput={(e) => setSub((e.target as HTMLInputElement).value)} />{" "}
        <button type="submit" disabled={!user.trim() || !sub.trim()}>
          Map
        </button>
      </form>
      <ErrorLine error={error} />
    </div>
  );
}
