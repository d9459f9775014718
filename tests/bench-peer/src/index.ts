// The peer of `scripts/bench peer`: Cloudflare's own chat agent framework on the same runtime,
// streaming from the same local OpenAI-compatible server Wuhu's `openai-compatible` provider
// uses. Written as the AIChatAgent README shows, with nothing tuned.
import { AIChatAgent } from "@cloudflare/ai-chat";
import { routeAgentRequest } from "agents";
import { convertToModelMessages, streamText } from "ai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";

type Env = { ChatAgent: DurableObjectNamespace; OPENAI_BASE_URL: string; BENCH_MODEL: string };

export class ChatAgent extends AIChatAgent<Env> {
  async onChatMessage() {
    const provider = createOpenAICompatible({
      name: "bench",
      baseURL: this.env.OPENAI_BASE_URL,
      apiKey: "bench",
    });
    const result = streamText({
      model: provider(this.env.BENCH_MODEL),
      messages: await convertToModelMessages(this.messages),
    });
    return result.toUIMessageStreamResponse();
  }
}

export default {
  async fetch(request: Request, env: Env): Promise<Response> {
    if (new URL(request.url).pathname === "/healthz") return new Response("ok");
    return (await routeAgentRequest(request, env)) ?? new Response("not found", { status: 404 });
  },
};
