// A minimal chat page on `useStream` (@langchain/langgraph-sdk/react), as front-ends such as Agent Chat UI build
// one: chat with a tool-calling agent, the thread list, reopening a thread, an interrupt's approval (sent as Agent
// Chat UI sends it: an empty input beside the command), stopping a run, and generative UI components loaded from
// the server (LoadExternalComponent). The server's URL comes from the page's `?api=`.
import React, { useCallback, useEffect, useState } from "react";
import { createRoot } from "react-dom/client";
import { Client, type Message, type Thread } from "@langchain/langgraph-sdk";
import { useStream } from "@langchain/langgraph-sdk/react";
import {
  isRemoveUIMessage,
  isUIMessage,
  LoadExternalComponent,
  type UIMessage,
  uiMessageReducer,
} from "@langchain/langgraph-sdk/react-ui";

type State = { messages: Message[]; ui?: UIMessage[] };

const params = new URLSearchParams(window.location.search);
const apiUrl = params.get("api") ?? window.location.origin;
const assistantId = params.get("assistant") ?? "agent";
const client = new Client({ apiUrl });

function text(message: Message): string {
  return typeof message.content === "string"
    ? message.content
    : message.content.map((part) => ("text" in part ? part.text : "")).join("");
}

function Threads({ current, onPick, version }: { current: string | null; onPick: (id: string) => void; version: number }) {
  const [threads, setThreads] = useState<Thread[]>([]);
  useEffect(() => {
    client.threads.search({ metadata: { graph_id: assistantId }, limit: 100 }).then(setThreads);
  }, [current, version]);
  return (
    <nav aria-label="History">
      <h2>History</h2>
      <ul>
        {threads.map((t) => (
          <li key={t.thread_id}>
            <button data-thread={t.thread_id} aria-current={t.thread_id === current} onClick={() => onPick(t.thread_id)}>
              {t.thread_id}
            </button>
          </li>
        ))}
      </ul>
    </nav>
  );
}

function App() {
  const [threadId, setThreadId] = useState<string | null>(params.get("thread"));
  const [draft, setDraft] = useState("");
  const [errors, setErrors] = useState<string[]>([]);
  const [finished, setFinished] = useState(0);
  const pick = useCallback((id: string | null) => {
    setThreadId(id);
    const url = new URL(window.location.href);
    if (id) url.searchParams.set("thread", id);
    else url.searchParams.delete("thread");
    window.history.replaceState(null, "", url);
  }, []);
  const stream = useStream<State>({
    apiUrl,
    assistantId,
    threadId,
    onThreadId: pick,
    fetchStateHistory: true,
    reconnectOnMount: true,
    onError: (error) => setErrors((e) => [...e, String(error)]),
    onFinish: () => setFinished((n) => n + 1),
    onCustomEvent: (event, options) => {
      if (isUIMessage(event) || isRemoveUIMessage(event)) {
        options.mutate((prev) => ({ ...prev, ui: uiMessageReducer(prev.ui ?? [], event) }));
      }
    },
  });
  const send = (event: React.FormEvent) => {
    event.preventDefault();
    const message: Message = { type: "human", content: draft };
    setDraft("");
    stream.submit(
      { messages: [message] },
      { streamMode: ["values"], optimisticValues: (prev) => ({ ...prev, messages: [...(prev.messages ?? []), message] }) },
    );
  };
  const interrupt = stream.interrupt?.value as { question?: string } | undefined;
  const ui = stream.values.ui ?? [];
  return (
    <main>
      <h1>Chat</h1>
      <p>
        thread: <output data-testid="thread-id">{threadId ?? "new"}</output> · runs finished:{" "}
        <output data-testid="finished">{finished}</output> · <span data-testid="status">{stream.isLoading ? "running" : "idle"}</span>
      </p>
      <button onClick={() => pick(null)}>New thread</button>
      <Threads current={threadId} onPick={pick} version={finished} />
      <ol aria-label="Messages">
        {stream.messages.map((m, i) => (
          <li key={m.id ?? i} data-type={m.type}>
            {m.type === "ai" && m.tool_calls?.length
              ? m.tool_calls.map((call) => <span key={call.id} data-testid="tool-call">tool call: {call.name} {JSON.stringify(call.args)}</span>)
              : null}
            {m.type === "tool" ? <span data-testid="tool-result">tool result: {text(m)}</span> : <span>{text(m)}</span>}
            {ui
              .filter((u) => u.metadata?.message_id === m.id)
              .map((u) => (
                <LoadExternalComponent key={u.id} stream={stream} message={u} fallback={<span>loading card</span>} />
              ))}
          </li>
        ))}
      </ol>
      {interrupt ? (
        <section aria-label="Interrupt">
          <p data-testid="interrupt">{interrupt.question}</p>
          <button onClick={() => stream.submit({}, { command: { resume: { approved: true } } })}>Approve</button>
          <button onClick={() => stream.submit({}, { command: { resume: { approved: false } } })}>Reject</button>
        </section>
      ) : null}
      <form onSubmit={send}>
        <label>
          Message <input value={draft} onChange={(e) => setDraft(e.target.value)} />
        </label>
        <button type="submit" disabled={stream.isLoading}>Send</button>
        <button type="button" onClick={() => stream.stop()} disabled={!stream.isLoading}>Stop</button>
      </form>
      <ul aria-label="Errors">{errors.map((e, i) => <li key={i} data-testid="error">{e}</li>)}</ul>
    </main>
  );
}

createRoot(document.getElementById("root")!).render(<App />);
