import { useEffect, useState } from "preact/hooks";
import { ApiError } from "./api";

/** "5 s ago", "3 min ago", or a date for older times. */
export function timeAgo(unixSeconds: number | null | undefined, now = Date.now() / 1000): string {
  if (!unixSeconds) return "never";
  const d = Math.max(0, Math.round(now - unixSeconds));
  if (d < 60) return `${d} s ago`;
  if (d < 3600) return `${Math.floor(d / 60)} min ago`;
  if (d < 86400) return `${Math.floor(d / 3600)} h ago`;
  return new Date(unixSeconds * 1000).toLocaleDateString();
}

/** How long until `unixSeconds`: `in 5 min`, `in 2 h`, `now`. */
export function timeUntil(unixSeconds: number, now = Date.now() / 1000): string {
  const d = Math.max(0, Math.round(unixSeconds - now));
  if (d < 60) return d === 0 ? "now" : `in ${d} s`;
  if (d < 3600) return `in ${Math.floor(d / 60)} min`;
  if (d < 86400) return `in ${Math.floor(d / 3600)} h`;
  return `on ${new Date(unixSeconds * 1000).toLocaleDateString()}`;
}

export function errorText(error: unknown): string {
  if (error instanceof ApiError) return `${error.message} (${error.status} ${error.code})`;
  if (error instanceof Error) return error.message;
  return String(error);
}

/** Runs `fn` every `ms` while the component is mounted and the page is visible. */
export function useInterval(fn: () => void, ms: number) {
  useEffect(() => {
    const id = window.setInterval(() => {
      if (document.visibilityState === "visible") fn();
    }, ms);
    return () => window.clearInterval(id);
  }, [fn, ms]);
}

/** Re-renders every `ms` (for relative times). */
export function useTick(ms: number): number {
  const [tick, setTick] = useState(0);
  useEffect(() => {
    const id = window.setInterval(() => setTick((t) => t + 1), ms);
    return () => window.clearInterval(id);
  }, [ms]);
  return tick;
}

export function ErrorLine({ error }: { error: string | null }) {
  if (!error) return null;
  return (
    <p class="error" role="alert">
      {error}
    </p>
  );
}

export function StatusBadge({ status }: { status: string }) {
  return <span class={`badge status-${status}`}>{status}</span>;
}

/** Copies text to the clipboard; falls back to selecting it where the clipboard is refused. */
export async function copyText(text: string): Promise<boolean> {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    return false;
  }
}
