// The generative UI components of the `agent` graph (langgraph.json's `ui` key), as a project writes them:
// bundled by the server and loaded in the browser by the SDK's LoadExternalComponent.
const WeatherCard = (props: { city: string; forecast: string; celsius: number }) => (
  <div className="weather-card" data-testid="weather-card">
    Weather card: {props.city}, {props.forecast}, {props.celsius} °C
  </div>
);

export default { weather: WeatherCard };
