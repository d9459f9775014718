// A parser for `text/event-stream` (the WHATWG rules that matter here): `event`, `data` and
// `id` fields, frames ended by a blank line, `:` comments ignored, CR LF or LF line ends.

export interface SseFrame {
  event: string;
  data: string;
  id: string | null;
}

export class SseParser {
  private buffer = "";
  private event = "";
  private data: string[] = [];
  private id: string | null = null;

  /** Feeds decoded text; returns the frames it completed. */
  push(text: string): SseFrame[] {
    this.buffer += text;
    const frames: SseFrame[] = [];
    for (;;) {
      const newline = this.buffer.search(/\r\n|\n|\r/);
      if (newline < 0) break;
      // A lone CR at the very end may be the first half of CR LF: wait for more.
      if (this.buffer[newline] === "\r" && newline === this.buffer.length - 1) break;
      const width = this.buffer.startsWith("\r\n", newline) ? 2 : 1;
      const line = this.buffer.slice(0, newline);
      this.buffer = this.buffer.slice(newline + width);
      if (line === "") {
        if (this.data.length > 0 || this.event !== "") {
          frames.push({ event: this.event || "message", data: this.data.join("\n"), id: this.id });
        }
        this.event = "";
        this.data = [];
        this.id = null;
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") this.event = value;
      else if (field === "data") this.data.push(value);
      else if (field === "id") this.id = value;
    }
    return frames;
  }
}
