//! PNG plots with plotters' bitmap backend: throughput over time of one run at 16 ms and 1 s,
//! and every tool of a scenario/workload at 1 s. Text is drawn with DejaVu Sans through
//! ab_glyph (no system font library needed; `fonts-dejavu-core` provides the file).

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{Result, anyhow};
use plotters::prelude::*;

const FONT_PATHS: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
];

/// Registers the font once; Err says why plots cannot have text.
pub fn init_font() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let path = FONT_PATHS
            .iter()
            .find(|p| Path::new(p).exists())
            .ok_or("DejaVuSans.ttf not found (apt-get install fonts-dejavu-core)")?;
        let bytes = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{path}: not a usable font"))
    })
    .clone()
}

/// Mbit/s per bin; the last bin covers only what is left of `window_ms`.
fn mbps(bins: &[u64], width_s: f64, window_ms: u64) -> Vec<(f64, f64, f64)> {
    let end = window_ms as f64 / 1000.0;
    bins.iter()
        .enumerate()
        .map(|(i, b)| {
            let t0 = i as f64 * width_s;
            let t1 = ((i + 1) as f64 * width_s).min(end.max(t0 + 1e-3));
            (t0, t1, *b as f64 * 8.0 / (t1 - t0) / 1e6)
        })
        .collect()
}

/// Two panels: 16 ms and 1 s bins of one run.
pub fn run_plot(
    path: &Path,
    title: &str,
    bins_16ms: &[u64],
    bins_1s: &[u64],
    window_ms: u64,
    link_mbps: f64,
) -> Result<()> {
    init_font().map_err(|e| anyhow!(e))?;
    let root = BitMapBackend::new(path, (1200, 800)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(400);
    let fine = mbps(bins_16ms, 0.016, window_ms);
    let coarse = mbps(bins_1s, 1.0, window_ms);
    let t_end = (window_ms as f64 / 1000.0).max(0.1);
    let y_max = fine
        .iter()
        .chain(coarse.iter())
        .map(|p| p.2)
        .fold(link_mbps, f64::max)
        * 1.1;
    for (area, series, label) in [(&top, &fine, "16 ms bins"), (&bottom, &coarse, "1 s bins")] {
        let mut chart = ChartBuilder::on(area)
            .caption(format!("{title} - {label}"), ("sans-serif", 20))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..t_end, 0f64..y_max)?;
        chart
            .configure_mesh()
            .x_desc("time from start, s")
            .y_desc("Mbit/s")
            .label_style(("sans-serif", 14))
            .draw()?;
        chart.draw_series(LineSeries::new(
            vec![(0.0, link_mbps), (t_end, link_mbps)],
            RED.mix(0.5),
        ))?;
        // Steps: each bin drawn flat over its width.
        let mut pts = Vec::with_capacity(series.len() * 2);
        for (t0, t1, v) in series.iter() {
            pts.push((*t0, *v));
            pts.push((*t1, *v));
        }
        chart.draw_series(LineSeries::new(pts, BLUE.stroke_width(1)))?;
    }
    root.present()?;
    Ok(())
}

/// Every tool of one scenario/workload at 1 s resolution.
pub fn overlay_plot(
    path: &Path,
    title: &str,
    lines: &[(String, Vec<u64>, u64)],
    link_mbps: f64,
) -> Result<()> {
    init_font().map_err(|e| anyhow!(e))?;
    let root = BitMapBackend::new(path, (1200, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let t_end = lines
        .iter()
        .map(|l| l.2 as f64 / 1000.0)
        .fold(1.0, f64::max);
    let y_max = lines
        .iter()
        .flat_map(|l| mbps(&l.1, 1.0, l.2))
        .map(|p| p.2)
        .fold(link_mbps, f64::max)
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..t_end, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("time from start, s")
        .y_desc("Mbit/s (1 s bins)")
        .label_style(("sans-serif", 14))
        .draw()?;
    for (i, (label, bins, window_ms)) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let pts: Vec<(f64, f64)> = mbps(bins, 1.0, *window_ms)
            .into_iter()
            .map(|(t0, t1, v)| ((t0 + t1) / 2.0, v))
            .collect();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))?
            .label(label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(())
}
